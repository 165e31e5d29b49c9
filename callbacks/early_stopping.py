"""EarlyStopping: stop training when an evaluation metric stops improving.

Events: ``on_fit_begin`` (warns once when no evaluation will ever run),
``on_eval_end`` (compares ``trainer.state.metrics[metric]`` with the best so
far and sets ``trainer.state.should_stop``). The metrics are already reduced
across ranks, so every rank takes the same decision and leaves the loop at
the same step. Evaluations outside ``fit()`` are not counted.

Options:

- ``metric``: a key of the evaluation metrics (default ``eval_loss``); a name
  without the ``eval_`` prefix (``accuracy``) is looked up as ``eval_accuracy``
  (``trainer.metric_keys``, shared with Checkpoint and load_best_model_at_end).
- ``mode``: ``min`` or ``max``; default ``min`` for names ending in ``loss``,
  ``max`` otherwise.
- ``patience``: evaluations in a row without improvement that stop training.
- ``min_delta``: an improvement must beat the best by more than this.

A value that is not finite (NaN, inf) never counts as an improvement. A
metric missing from the metrics is a ConfigError that lists the metrics there
are (raised inside ``on_eval_end``, so fit() reports it as
``callback EarlyStopping failed in on_eval_end: ConfigError: ...``).

State saved: ``best``, ``best_step``, ``wait`` (evaluations without
improvement so far), ``stopped_step``; a resumed run keeps counting.

    >>> EarlyStopping(metric="eval_accuracy").mode
    'max'
"""

from __future__ import annotations

import logging
import math
from typing import Optional

from trainer.errors import ConfigError
from trainer.metric_keys import metric_key

from .base import Callback

logger = logging.getLogger("trainer")


class EarlyStopping(Callback):
    order = 30  # after FlowControl (20); before loggers and checkpoints, which then see should_stop

    def __init__(self, metric: str = "eval_loss", mode: Optional[str] = None, patience: int = 3, min_delta: float = 0.0):
        if not isinstance(metric, str) or not metric:
            raise ConfigError(f"EarlyStopping(metric={metric!r}) is not allowed: give a metric name such as 'eval_loss'")
        if mode is None:
            mode = "min" if metric.endswith("loss") else "max"
        if mode not in ("min", "max"):
            raise ConfigError(f"EarlyStopping(mode={mode!r}) is not allowed: choose 'min' or 'max'")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ConfigError(f"EarlyStopping(patience={patience!r}) is not allowed: give an integer >= 1")
        if not (isinstance(min_delta, (int, float)) and min_delta >= 0):
            raise ConfigError(f"EarlyStopping(min_delta={min_delta!r}) is not allowed: give a number >= 0")
        self.metric, self.mode, self.patience, self.min_delta = metric, mode, patience, float(min_delta)
        self.best: Optional[float] = None
        self.best_step: Optional[int] = None
        self.wait = 0
        self.stopped_step: Optional[int] = None

    def improved(self, value: float) -> bool:
        """Whether ``value`` beats the best so far by more than ``min_delta``."""
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def _value(self, metrics: dict) -> float:
        return float(metrics[metric_key(self.metric, metrics, owner="EarlyStopping metric")])

    # ---- events ---------------------------------------------------------------------
    def on_fit_begin(self, trainer):
        a = trainer.args
        if trainer.is_main_process and (trainer.eval_dataset is None or a.evaluation_strategy == "no"):
            logger.warning("EarlyStopping: %s, so no evaluation runs and training will not stop early",
                           "no eval_dataset" if trainer.eval_dataset is None else "evaluation_strategy='no'")

    def on_eval_end(self, trainer):
        state = trainer.state
        if state.status != "running":
            return  # evaluate() called outside fit()
        value = self._value(state.metrics)
        if self.improved(value):
            self.best, self.best_step, self.wait = value, state.global_step, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            state.should_stop = True
            self.stopped_step = state.global_step
            if trainer.is_main_process:
                logger.info("EarlyStopping: stopping at step %d: %s=%.6g has not improved on %.6g (step %s) by more "
                            "than %g for %d evaluations", state.global_step, self.metric, value,
                            self.best if self.best is not None else float("nan"), self.best_step,
                            self.min_delta, self.wait)

    # ---- state ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"metric": self.metric, "mode": self.mode, "best": self.best, "best_step": self.best_step,
                "wait": self.wait, "stopped_step": self.stopped_step}

    def load_state_dict(self, state: dict) -> None:
        if state.get("metric", self.metric) != self.metric or state.get("mode", self.mode) != self.mode:
            logger.warning("EarlyStopping: the checkpoint tracked %s (%s), this run tracks %s (%s): starting afresh",
                           state.get("metric"), state.get("mode"), self.metric, self.mode)
            return
        self.best, self.best_step = state.get("best"), state.get("best_step")
        self.wait, self.stopped_step = int(state.get("wait", 0)), state.get("stopped_step")
