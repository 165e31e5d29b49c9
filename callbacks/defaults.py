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
AMP                ``amp`` fp16 or bf16 (``amp_level`` O1/O2)   0
=================  ===========================================  ======

GPUUtilizationMonitor (order 90) joins Rank0Logger when ``report_to`` is not empty: it samples in a background thread and adds GPU/CPU figures and ``data_wait_share`` to the logs.

NaNGuard is not in the default set: skipping a non-finite step costs one host
sync per optimizer step in paddle's dygraph optimizers (see callbacks.nan_guard);
add it with ``Trainer(callbacks=[NaNGuard()])``.

Pass ``Trainer(callbacks=[...])`` to add more; ``trainer.remove_callback(T)``
to drop one; subclass and replace to change a policy.
"""

from __future__ import annotations

from typing import List

from .amp import AMP
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
    if args.amp != "off":
        out.append(AMP(dtype={"fp16": "float16", "bf16": "bfloat16"}[args.amp], level=args.amp_level))
    return out
