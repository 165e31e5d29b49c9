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
GPUUtilizationMonitor  ``report_to`` not empty (background sampler)       90
Rank0Logger            ``report_to`` not empty                            100
Checkpoint             always (best-K, ``save_total_limit`` rotation)     200
=====================  =================================================  =====

Not in the default set, add them with ``Trainer(callbacks=[...])``:
NaNGuard (skipping a non-finite step costs one host sync per optimizer step in
paddle's dygraph optimizers), EarlyStopping (needs a metric and a patience),
Export (writes an inference model at the end of fit()).

``trainer.remove_callback(T)`` drops one; subclass and replace to change a policy.
"""

from __future__ import annotations

from typing import List

from trainer.distributed import get_world_size

from .amp import AMP
from .base import Callback
from .checkpoint import Checkpoint
from .flow import FlowControl
from .gpu_monitor import GPUUtilizationMonitor
from .logger import Rank0Logger
from .lr_warmup import LRWarmup
from .preemption import Preemption
from .watchdog import StallWatchdog


def default_callbacks(args) -> List[Callback]:
    out: List[Callback] = [Preemption(), FlowControl(), Checkpoint()]
    if args.report_to:
        out.append(Rank0Logger())
        out.append(GPUUtilizationMonitor())  # background sampler; on_step_end adds two host floats
    if args.warmup_steps > 0 or args.warmup_ratio > 0 or args.scale_lr_by_batch:
        out.append(LRWarmup())
    if args.amp != "off":
        out.append(AMP(dtype={"fp16": "float16", "bf16": "bfloat16"}[args.amp], level=args.amp_level))
    if get_world_size() > 1:  # the launcher's environment: one watchdog per rank
        out.append(StallWatchdog())
    return out
