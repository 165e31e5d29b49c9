"""Learning-rate schedules counted in optimizer steps: linear warmup, then decay.

``WarmupDecay`` is a ``paddle.optimizer.lr.LRScheduler`` whose value after
``n`` optimizer steps is ``peak * factor(n)``, a closed form of ``n``; so its
checkpointed state is one counter, and resuming is exact. The LR used by the
first step is ``peak / warmup_steps`` (no step is wasted at LR 0); the
``warmup_steps``-th step uses ``peak``.

    >>> s = WarmupDecay(0.1, total_steps=20, warmup_steps=10, decay="linear")
    >>> [round(s.factor(n), 2) for n in (0, 4, 9, 10, 15, 20)]
    [0.1, 0.5, 1.0, 1.0, 0.5, 0.0]
"""

from __future__ import annotations

import bisect
import math
from typing import Sequence

from paddle.optimizer.lr import LRScheduler

from .errors import ConfigError


class WarmupDecay(LRScheduler):
    """Linear warmup over ``warmup_steps``, then ``decay``.

    decay: ``constant``; ``linear`` (to 0 at ``total_steps``); ``cosine`` (to 0);
    ``step`` (times ``gamma`` every ``step_size`` steps after warmup);
    ``multistep`` (times ``gamma`` at each of ``milestones``, in steps).
    """

    def __init__(self, peak_lr: float, total_steps: int, warmup_steps: int = 0, decay: str = "constant",
                 gamma: float = 0.1, step_size: int = 1, milestones: Sequence[int] = ()):
        if decay not in ("constant", "linear", "cosine", "step", "multistep"):
            raise ConfigError(f"lr_scheduler_type={decay!r} is not allowed: choose constant, linear, cosine, step or multistep")
        self.total_steps = max(1, int(total_steps))
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.gamma = gamma
        self.step_size = max(1, int(step_size))
        self.milestones = sorted(int(m) for m in milestones)
        super().__init__(learning_rate=peak_lr)

    def factor(self, n: int) -> float:
        """Multiplier of the peak LR for the step that follows ``n`` finished steps."""
        w = self.warmup_steps
        if n < w:
            return (n + 1) / w
        if self.decay == "constant":
            return 1.0
        if self.decay in ("linear", "cosine"):
            span = max(1, self.total_steps - w)
            progress = min(1.0, (n - w) / span)
            if self.decay == "linear":
                return 1.0 - progress
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if self.decay == "step":
            return self.gamma ** ((n - w) // self.step_size)
        return self.gamma ** bisect.bisect_right(self.milestones, n)

    def get_lr(self) -> float:
        return self.base_lr * self.factor(self.last_epoch)


def warmup_steps_for(warmup_steps: int, warmup_ratio: float, total_steps: int) -> int:
    """``warmup_steps`` when > 0, else ``ceil(warmup_ratio * total_steps)``."""
    if warmup_steps > 0:
        return warmup_steps
    return int(math.ceil(warmup_ratio * total_steps))


def build_scheduler(args, total_steps: int, steps_per_epoch: int, peak_lr: float) -> WarmupDecay:
    """The schedule ``TrainingArguments`` asks for (step/multistep given in epochs)."""
    return WarmupDecay(
        peak_lr,
        total_steps=total_steps,
        warmup_steps=warmup_steps_for(args.warmup_steps, args.warmup_ratio, total_steps),
        decay=args.lr_scheduler_type,
        gamma=args.lr_gamma,
        step_size=args.lr_step_size * max(1, steps_per_epoch),
        milestones=[m * max(1, steps_per_epoch) for m in args.lr_milestones],
    )
