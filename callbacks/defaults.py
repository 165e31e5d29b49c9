"""The default callback set: the one place where ``TrainingArguments`` switch
built-in callbacks on.

=====================  =================================================  =====
callback               switched on by                                     order
=====================  =================================================  =====
AMP                    ``amp`` fp16 or bf16 (``amp_level`` O1/O2)         0
Preemption             always (SIGTERM/SIGINT: agree, save, stop)         5
LRWarmup               ``warmup_steps``, ``warmup_ratio`` or               10
                       ``scale_lr_by_batch``
FlowControl            always (intervals -> state flags)                  20
StallWatchdog          more than one process (world size > 1)             85
NaNGuard(action=stop)  always, unless a NaNGuard or LossSpikeRecovery     95
                       is given (``check_gradients=False``: stops at the
                       next logging step after a non-finite loss, clip
                       norm or parameters; no host sync and no device
                       work of its own per step)
GPUUtilizationMonitor  ``report_to`` not empty (GPU: background sampler)  90
Rank0Logger            ``report_to`` not empty                            100
TensorBoardTracker,    ``report_to`` tensorboard, wandb, mlflow (or      310
WandbTracker,          ``all`` with the tracker installed; see
MLflowTracker          ``callbacks.tracking``)
Checkpoint             always (best-K, ``save_total_limit`` rotation)     200
LoadBestModel          ``load_best_model_at_end``                         210
=====================  =================================================  =====

Not in the default set, add them with ``Trainer(callbacks=[...])``:
NaNGuard() with action 'skip' (skipping a non-finite step costs one host sync
per optimizer step in paddle's dygraph optimizers), EarlyStopping (needs a
metric and a patience), Export (writes an inference model at the end of fit()).
IterableDatasetState (order 190) is switched on by the data, not by an argument:
``Trainer.get_train_dataloader`` adds it for an ``IterableDataset`` with
``state_dict``/``load_state_dict`` (``callbacks.iterable_dataset_state``).

A callback given to ``Trainer(callbacks=[...])`` that is an instance of a
default callback's class replaces that default (``callback_set``): e.g.
``NaNGuard()`` turns the default stop into skipping, ``Checkpoint(best_k=3)``
keeps three best checkpoints. ``trainer.remove_callback(T)`` drops one;
subclass and replace to change a policy.
"""

from __future__ import annotations

from typing import Iterable, List

from trainer.distributed import get_world_size

from .amp import AMP
from .base import Callback
from .checkpoint import Checkpoint
from .flow import FlowControl
from .gpu_monitor import GPUUtilizationMonitor
from .load_best import LoadBestModel
from .logger import Rank0Logger
from .lr_warmup import LRWarmup
from .nan_guard import NaNGuard
from .preemption import Preemption
from .spike_recovery import LossSpikeRecovery
from .tracking import tracker_callbacks
from .watchdog import StallWatchdog


def callback_set(args, user_callbacks: Iterable[Callback] = ()) -> List[Callback]:
    """The defaults ``args`` switch on, minus those a user's callback of the same class replaces, then the user's."""
    user = list(user_callbacks or [])
    defaults = [d for d in default_callbacks(args) if not any(isinstance(u, type(d)) for u in user)]
    if any(isinstance(u, LossSpikeRecovery) for u in user):  # it rolls non-finite windows back itself
        defaults = [d for d in defaults if not isinstance(d, NaNGuard)]
    return defaults + user


def default_callbacks(args) -> List[Callback]:
    # the guard rides on the loss, the clip norm and a parameter check at logging steps (callbacks.nan_guard)
    out: List[Callback] = [Preemption(), FlowControl(), Checkpoint(), NaNGuard(action="stop", check_gradients=False)]
    if args.report_to:
        out.append(Rank0Logger())
        out.append(GPUUtilizationMonitor())  # NVML sampler thread (CPU: none); on_step_end adds two host floats
        out.extend(tracker_callbacks(args.report_to))  # tensorboard, wandb, mlflow: each only when asked for
    if args.warmup_steps > 0 or args.warmup_ratio > 0 or args.scale_lr_by_batch:
        out.append(LRWarmup())
    if args.amp != "off":
        out.append(AMP(dtype={"fp16": "float16", "bf16": "bfloat16"}[args.amp], level=args.amp_level))
    if args.load_best_model_at_end:
        out.append(LoadBestModel())
    if get_world_size() > 1:  # the launcher's environment: one watchdog per rank
        out.append(StallWatchdog())
    return out
