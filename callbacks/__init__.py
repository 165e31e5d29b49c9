"""Callbacks for :class:`trainer.Trainer`: subclass :class:`Callback` to write your own.

Importing this package is light: it imports neither paddlenlp nor the
optional writers (VisualDL, matplotlib), which load when first used.
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
