"""Learning-rate schedules counted in optimizer steps: linear warmup, then decay.

``WarmupDecay`` is a ``paddle.optimizer.lr.LRScheduler`` whose value after
``n`` optimizer steps is ``peak * factor(n)``, a closed form of ``n``; so its
checkpointed state is one counter, and resuming is exact.

Warmup: the LR after ``n`` finished steps is ``peak * (n + 1) / (warmup_steps + 1)``
while ``n < warmup_steps``; so the first step does not waste itself at LR 0,
the LR rises at every one of the ``warmup_steps`` steps, and the step that
follows them is the first at ``peak``. The decay then starts from ``peak``:

    >>> s = WarmupDecay(0.1, total_steps=20, warmup_steps=10, decay="linear")
    >>> [round(s.factor(n), 3) for n in (0, 4, 9, 10, 15, 20)]
    [0.091, 0.455, 0.909, 1.0, 0.5, 0.0]

``WithWarmup`` puts the same ramp in front of any other scheduler (or a
constant LR): the value is ``lr_scale * ramp(n) * inner()``, the inner
scheduler keeping its own clock (it is stepped once per optimizer step,
warmup included, so its milestones mean what they say).

    >>> w = WithWarmup(paddle.optimizer.lr.MultiStepDecay(0.1, milestones=[6], gamma=0.1), warmup_steps=3)
    >>> lrs = []
    >>> for _ in range(8):
    ...     lrs.append(round(w(), 4)); w.step()
    >>> lrs
    [0.025, 0.05, 0.075, 0.1, 0.1, 0.1, 0.01, 0.01]
"""

from __future__ import annotations

import bisect
import math
from typing import Sequence, Union

import paddle
from paddle.optimizer.lr import LRScheduler

from ..errors import ConfigError

DECAYS = ("constant", "linear", "cosine", "step", "multistep")


def warmup_ramp(n: int, warmup_steps: int) -> float:
    """Multiplier of the peak LR after ``n`` finished steps of a ``warmup_steps`` ramp."""
    if n < warmup_steps:
        return (n + 1) / (warmup_steps + 1)
    return 1.0


class WarmupDecay(LRScheduler):
    """Linear warmup over ``warmup_steps``, then ``decay``.

    decay: ``constant``; ``linear`` (from peak at the end of warmup to 0 at
    ``total_steps``); ``cosine`` (likewise, half a cosine); ``step`` (times
    ``gamma`` every ``step_size`` steps); ``multistep`` (times ``gamma`` at each
    of ``milestones``). Step and multistep count from the first step of
    training, warmup included (ResNet's "decay at epochs 30, 60, 80" with a
    5-epoch warmup), so warmup only overrides their first steps.

    ``lr_scale`` records the factor already applied to ``peak_lr`` by the linear
    scaling rule (``build_scheduler`` sets it), so ``callbacks.LRWarmup`` never
    applies it twice.
    """

    def __init__(self, peak_lr: float, total_steps: int, warmup_steps: int = 0, decay: str = "constant",
                 gamma: float = 0.1, step_size: int = 1, milestones: Sequence[int] = (), lr_scale: float = 1.0):
        if decay not in DECAYS:
            raise ConfigError(f"lr_scheduler_type={decay!r} is not allowed: choose one of {', '.join(DECAYS)}")
        if int(warmup_steps) < 0:
            raise ConfigError(f"warmup_steps={warmup_steps!r} is not allowed: warmup_steps must be an integer >= 0")
        self.total_steps = max(1, int(total_steps))
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.gamma = gamma
        self.step_size = max(1, int(step_size))
        self.milestones = sorted(int(m) for m in milestones)
        self.lr_scale = float(lr_scale)
        super().__init__(learning_rate=peak_lr)

    def factor(self, n: int) -> float:
        """Multiplier of the peak LR for the step that follows ``n`` finished steps."""
        w = self.warmup_steps
        if n < w:
            return warmup_ramp(n, w)
        if self.decay == "constant":
            return 1.0
        if self.decay in ("linear", "cosine"):
            span = max(1, self.total_steps - w)
            progress = min(1.0, (n - w) / span)
            if self.decay == "linear":
                return 1.0 - progress
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if self.decay == "step":
            return self.gamma ** (n // self.step_size)
        return self.gamma ** bisect.bisect_right(self.milestones, n)

    def get_lr(self) -> float:
        return self.base_lr * self.factor(self.last_epoch)

    def reconfigure(self, warmup_steps: int = None, lr_scale: float = None) -> None:
        """Change the warmup length, or multiply the peak by ``lr_scale / self.lr_scale``,
        and recompute the current value (the schedule is a closed form, so this is
        exact at any point; ``callbacks.LRWarmup`` calls it before training)."""
        if warmup_steps is not None:
            self.warmup_steps = int(warmup_steps)
        if lr_scale is not None and not math.isclose(lr_scale, self.lr_scale, rel_tol=1e-12):
            self.base_lr = self.base_lr * lr_scale / self.lr_scale
            self.lr_scale = float(lr_scale)
        self.step(self.last_epoch)  # public way to recompute last_lr without advancing


class WithWarmup(LRScheduler):
    """``lr_scale * warmup_ramp(n) * inner()``, stepping ``inner`` once per step.

    inner: a ``paddle.optimizer.lr.LRScheduler`` (not ReduceOnPlateau, whose
    step needs a metric), or a constant learning rate. State: this wrapper's
    counter and the inner scheduler's state, so a checkpoint restores both.
    """

    def __init__(self, inner: Union[LRScheduler, float], warmup_steps: int, lr_scale: float = 1.0):
        if isinstance(inner, paddle.optimizer.lr.ReduceOnPlateau):
            raise ConfigError("ReduceOnPlateau cannot be wrapped with a warmup (its step needs a metric): "
                              "use a step-based scheduler, or set warmup_steps=0 and warm up yourself")
        if not isinstance(inner, (LRScheduler, float, int)) or isinstance(inner, bool):
            raise ConfigError(f"the learning rate to warm up is a {type(inner).__name__}: "
                              "give a float or a paddle.optimizer.lr.LRScheduler")
        self.inner = inner
        self.warmup_steps = int(warmup_steps)
        self.lr_scale = float(lr_scale)
        self._ready = False  # LRScheduler.__init__ calls step(): do not advance inner then
        super().__init__(learning_rate=self._inner_lr())
        self._ready = True

    def _inner_lr(self) -> float:
        return float(self.inner()) if isinstance(self.inner, LRScheduler) else float(self.inner)

    def step(self, epoch: int = None) -> None:
        if self._ready and isinstance(self.inner, LRScheduler):
            if epoch is None:
                self.inner.step()
            else:
                self.inner.step(epoch)
        super().step(epoch)

    def get_lr(self) -> float:
        return self.lr_scale * warmup_ramp(self.last_epoch, self.warmup_steps) * self._inner_lr()

    def state_dict(self) -> dict:
        out = {"last_epoch": self.last_epoch, "last_lr": self.last_lr}
        if isinstance(self.inner, LRScheduler):
            out["inner"] = self.inner.state_dict()
        return out

    def set_state_dict(self, state: dict) -> None:
        for key in ("last_epoch", "last_lr"):
            if key not in state:
                raise ConfigError(f"the scheduler state in the checkpoint has no {key!r}: "
                                  "it was saved without a warmup wrapper; resume with the callbacks that wrote it")
        self.last_epoch, self.last_lr = int(state["last_epoch"]), float(state["last_lr"])
        if isinstance(self.inner, LRScheduler) and "inner" in state:
            self.inner.set_state_dict(state["inner"])

    set_dict = set_state_dict


def warmup_steps_for(warmup_steps: int, warmup_ratio: float, total_steps: int) -> int:
    """``warmup_steps`` when > 0, else ``ceil(warmup_ratio * total_steps)``."""
    if warmup_steps > 0:
        return warmup_steps
    return int(math.ceil(warmup_ratio * total_steps))


def linear_scaling_factor(scale_lr_by_batch, global_batch_size: int) -> float:
    """global batch / reference batch when the linear scaling rule is on, else 1."""
    if not scale_lr_by_batch:
        return 1.0
    return global_batch_size / scale_lr_by_batch


def build_scheduler(args, total_steps: int, steps_per_epoch: int, peak_lr: float) -> WarmupDecay:
    """The schedule ``TrainingArguments`` asks for (step/multistep given in epochs).

    ``peak_lr`` comes from ``trainer.optim.optimizer.peak_lr``, which already applied the linear
    scaling rule when ``args.scale_lr_by_batch`` is set; ``lr_scale`` records
    the factor so nothing applies it again.
    """
    return WarmupDecay(
        peak_lr,
        total_steps=total_steps,
        warmup_steps=warmup_steps_for(args.warmup_steps, args.warmup_ratio, total_steps),
        decay=args.lr_scheduler_type,
        gamma=args.lr_gamma,
        step_size=args.lr_step_size * max(1, steps_per_epoch),
        milestones=[m * max(1, steps_per_epoch) for m in args.lr_milestones],
        lr_scale=peak_lr / args.learning_rate if args.learning_rate else 1.0,  # 0: a frozen run
    )
