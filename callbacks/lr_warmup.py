"""LRWarmup: linear learning-rate warmup and the linear scaling rule, for any schedule.

Events: ``on_load_begin`` and ``on_fit_begin`` (both install the warmup, once,
before the first step; installing before a checkpoint is restored lets the
checkpoint's scheduler state land in the scheduler it was saved from).

Options (each defaults to the ``TrainingArguments`` field of the same name):

- ``warmup_steps``: optimizer steps of linear warmup (not micro-batches);
  wins over ``warmup_ratio`` when > 0.
- ``warmup_ratio``: warmup as a fraction of all optimizer steps of the run
  (``ceil(ratio * state.max_steps)``).
- ``scale_lr_by_batch``: reference batch of the linear scaling rule: peak lr =
  base lr x global batch / reference, global batch = per-device batch x world
  size x gradient_accumulation_steps (``state.global_batch_size``).

Who applies the warmup, so it happens exactly once:

- the schedule is a ``trainer.optim.schedules.WarmupDecay`` (what the trainer builds
  when it builds the optimizer, from ``lr_scheduler_type``): its own closed-form
  ramp is the warmup. LRWarmup sets its length (the same value the trainer took
  from the arguments, unless LRWarmup was given other options) and applies the
  scaling rule unless ``WarmupDecay.lr_scale`` says the trainer already did.
- any other scheduler (``Trainer(lr_scheduler=...)``), or none (a user's
  optimizer with a constant LR): LRWarmup wraps it in
  ``trainer.optim.schedules.WithWarmup``, hands the wrapper to the optimizer
  (``optimizer.set_lr_scheduler``) and makes it ``trainer.lr_scheduler``, which
  the trainer steps once per optimizer step and saves in checkpoints. The inner
  scheduler keeps its own clock. A scheduler that lives only inside a
  user-built optimizer is not visible to the trainer: pass it as
  ``Trainer(lr_scheduler=...)`` too.
- a scheduler with an attribute ``includes_warmup = True`` (what a PaddleNLP
  ``TrainingArguments`` gets: paddlenlp's own ``get_scheduler``) is left alone.

The ramp: after ``n < warmup_steps`` finished steps the LR is
``peak * (n + 1) / (warmup_steps + 1)``; from step ``warmup_steps`` on, the
schedule's own value. ``TrainingArguments`` switch LRWarmup on
(``callbacks.defaults``) when ``warmup_steps``, ``warmup_ratio`` or
``scale_lr_by_batch`` is set.

State saved: the resolved ``warmup_steps``, ``lr_scale`` and what the warmup
was applied to; a resumed run that resolves other values (e.g. another world
size under the scaling rule) logs a warning, and this run's arguments win, as
for the rest of the plan. The position in the schedule is the scheduler's own
state, saved by the trainer (``lr_scheduler`` in ``trainer.json``), so resuming
through ``fit(resume_from_checkpoint=...)`` continues the curve exactly.

    >>> LRWarmup(warmup_steps=10).warmup_steps
    10
"""

from __future__ import annotations

import logging
import math
from typing import Optional

from trainer.distributed import is_main_process
from trainer.errors import ConfigError
from trainer.optim.schedules import WarmupDecay, WithWarmup, linear_scaling_factor, warmup_steps_for

from .base import Callback

logger = logging.getLogger("trainer")


class LRWarmup(Callback):
    order = 10

    def __init__(self, warmup_steps: Optional[int] = None, warmup_ratio: Optional[float] = None,
                 scale_lr_by_batch: Optional[int] = None):
        if warmup_steps is not None and (isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0):
            raise ConfigError(f"LRWarmup(warmup_steps={warmup_steps!r}) is not allowed: give an integer >= 0 or None (use the arguments)")
        if warmup_ratio is not None and not 0 <= warmup_ratio < 1:
            raise ConfigError(f"LRWarmup(warmup_ratio={warmup_ratio!r}) is not allowed: give a number in [0, 1) or None")
        if scale_lr_by_batch is not None and not scale_lr_by_batch > 0:
            raise ConfigError(f"LRWarmup(scale_lr_by_batch={scale_lr_by_batch!r}) is not allowed: give a reference batch size > 0 or None")
        self.warmup_steps = warmup_steps
        self.warmup_ratio = warmup_ratio
        self.scale_lr_by_batch = scale_lr_by_batch
        self.resolved_warmup_steps: Optional[int] = None
        self.lr_scale: Optional[float] = None
        self.applied_to: Optional[str] = None
        self._done = False
        self._scheduler = None  # the scheduler this callback configured or installed

    # ---- policy ------------------------------------------------------------------
    def resolve(self, trainer) -> tuple:
        """``(warmup_steps, lr_scale)`` for this run: options, else the arguments."""
        a, s = trainer.args, trainer.state
        steps = self.warmup_steps if self.warmup_steps is not None else a.warmup_steps
        ratio = self.warmup_ratio if self.warmup_ratio is not None else a.warmup_ratio
        reference = self.scale_lr_by_batch if self.scale_lr_by_batch is not None else a.scale_lr_by_batch
        return warmup_steps_for(steps, ratio, s.max_steps), linear_scaling_factor(reference, s.global_batch_size)

    def _install(self, trainer) -> None:
        if self._done and trainer.lr_scheduler is self._scheduler:
            return
        if trainer.optimizer is None or trainer.state.max_steps <= 0:
            return  # not planned yet (a load before fit); on_fit_begin installs
        warmup, scale = self.resolve(trainer)
        sched = trainer.lr_scheduler
        if getattr(sched, "includes_warmup", False):  # a schedule with its own warmup (PaddleNLP's get_scheduler)
            warmup, self.applied_to = 0, f"nothing ({type(sched).__name__} warms up itself)"
        elif isinstance(sched, WarmupDecay):
            sched.reconfigure(warmup_steps=warmup if warmup > 0 else None, lr_scale=scale)
            warmup, self.applied_to = sched.warmup_steps, f"WarmupDecay({sched.decay})"
        elif warmup > 0 or scale != 1.0:
            inner = sched if sched is not None else float(trainer.optimizer.get_lr())
            sched = WithWarmup(inner, warmup, scale)
            trainer.optimizer.set_lr_scheduler(sched)
            trainer.lr_scheduler = sched
            self.applied_to = f"WithWarmup({type(inner).__name__})"
        else:
            self.applied_to = "nothing (no warmup, no scaling)"
        self.resolved_warmup_steps, self.lr_scale = warmup, scale
        self._scheduler, self._done = sched, True
        if trainer.is_main_process:
            self._report(trainer, warmup, scale)

    def _report(self, trainer, warmup: int, scale: float) -> None:
        s = trainer.state
        rule = f", x{scale:g} by the linear scaling rule (global batch {s.global_batch_size})" if scale != 1.0 else ""
        logger.debug("LRWarmup: %d warmup steps on %s%s", warmup, self.applied_to, rule)
        if warmup >= s.max_steps:
            logger.warning("LRWarmup: warmup_steps=%d >= the run's %d optimizer steps: the LR never reaches its peak; "
                           "lower warmup_steps or warmup_ratio", warmup, s.max_steps)

    # ---- events --------------------------------------------------------------------
    def on_load_begin(self, trainer):
        self._install(trainer)

    def on_fit_begin(self, trainer):
        self._install(trainer)

    # ---- state -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"warmup_steps": self.resolved_warmup_steps, "lr_scale": self.lr_scale, "applied_to": self.applied_to}

    def load_state_dict(self, state: dict) -> None:
        if not self._done or state.get("warmup_steps") is None:
            return
        old_scale = state.get("lr_scale")
        same_scale = old_scale is None or math.isclose(old_scale, self.lr_scale, rel_tol=1e-9)
        if (state["warmup_steps"] != self.resolved_warmup_steps or not same_scale) and is_main_process():
            logger.warning("LRWarmup: the checkpoint was trained with warmup_steps=%s, lr_scale=%s; this run resolves "
                           "warmup_steps=%s, lr_scale=%s and uses them", state["warmup_steps"], old_scale,
                           self.resolved_warmup_steps, self.lr_scale)
