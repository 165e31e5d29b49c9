"""Callbacks for :class:`trainer.Trainer`: subclass :class:`Callback` to write your own.

Importing this package is light: it imports neither paddlenlp nor the
optional writers (VisualDL, matplotlib), which load when first used.

Owns: policy, everything optional: the base class and its dispatcher (``base``), the default set
(``defaults``), and one callback a file (``amp`` with ``loss_scaler``, ``lr_warmup``, ``flow``, ``logger``
with ``plots`` and ``visualdl_records``, ``gpu_monitor``, ``checkpoint``, ``preemption``, ``watchdog`` with
``stall_blame``, ``nan_guard``, ``load_best``, ``early_stopping``, ``spike_recovery``, ``export``,
``iterable_dataset_state``; the trackers ``tensorboard_tracker``, ``wandb_tracker``, ``mlflow_tracker`` and what
they share, ``tracking``).

May import: paddle, ``trainer.errors``, ``trainer.events``, ``trainer.distributed``, ``trainer.process``,
``trainer.heap``, ``trainer.metric_keys``, ``trainer.optim`` (the LR schedules), ``trainer.data`` (a stream's
batches), ``trainer.checkpoint`` (the files a save writes, the fence), ``trainer.deploy`` (export). Never the loop
(a callback is handed the trainer), the launcher, the commands or models.

Used by: ``trainer.trainer`` (the default set, the stream's state), ``trainer.compat`` (the adapters), ``trainer.cli``
(``cli.run``: the log file; ``cli.verify_resume``: its callbacks), users.
"""

from .amp import AMP
from .base import Callback, CallbackList
from .checkpoint import Checkpoint
from .defaults import default_callbacks
from .flow import FlowControl
from .gpu_monitor import GPUUtilizationMonitor
from .nan_guard import NaNGuard
from .logger import Rank0Logger
from .preemption import Preemption
from .lr_warmup import LRWarmup
from .load_best import LoadBestModel
from .early_stopping import EarlyStopping
from .export import Export
from .watchdog import StallWatchdog
from .spike_recovery import LossSpikeRecovery
from .tensorboard_tracker import TensorBoardTracker  # the trackers import their libraries when a run starts
from .wandb_tracker import WandbTracker
from .mlflow_tracker import MLflowTracker

__all__ = ["Export", "GPUUtilizationMonitor", "AMP", "NaNGuard", "EarlyStopping", "LRWarmup", "LoadBestModel", "Callback", "CallbackList", "Checkpoint", "FlowControl", "Rank0Logger", "Preemption", "default_callbacks", "StallWatchdog", "LossSpikeRecovery", "TensorBoardTracker", "WandbTracker", "MLflowTracker"]
