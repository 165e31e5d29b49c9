"""The default callback set: the one place where ``TrainingArguments`` switch
built-in callbacks on.

=================  ===========================================  ======
callback           switched on by                               order
=================  ===========================================  ======
FlowControl        always (turns intervals into state flags)    20
Checkpoint         always (best checkpoint, save_total_limit)   200
Rank0Logger        ``report_to`` not empty                      100
LRWarmup           ``warmup_steps``, ``warmup_ratio`` or        10
                   ``scale_lr_by_batch`` set
=================  ===========================================  ======

GPUUtilizationMonitor (order 90) joins Rank0Logger when ``report_to`` is not empty: it samples in a background thread and adds GPU/CPU figures and ``data_wait_share`` to the logs.

Pass ``Trainer(callbacks=[...])`` to add more; ``trainer.remove_callback(T)``
to drop one; subclass and replace to change a policy.
"""

from __future__ import annotations

from typing import List

from .base import Callback
from .checkpoint import Checkpoint
from .flow import FlowControl
from .gpu_monitor import GPUUtilizationMonitor
from .logger import Rank0Logger
from .lr_warmup import LRWarmup


def default_callbacks(args) -> List[Callback]:
    out: List[Callback] = [FlowControl(), Checkpoint()]
    if args.report_to:
        out.append(Rank0Logger())
        out.append(GPUUtilizationMonitor())  # background sampler; on_step_end adds two host floats
    if args.warmup_steps > 0 or args.warmup_ratio > 0 or args.scale_lr_by_batch:
        out.append(LRWarmup())
    return out
