"""LossSpikeRecovery: when the logged loss goes bad and stays bad, roll back to
the last good checkpoint, skip the batches since then, and go on.

What counts as bad. Each training log record's ``loss`` (``state.logs`` in
``on_log``: already the mean over the logging window, reduced across ranks, so
every rank takes the same decision at the same step) is bad when it is not
finite, when it is above ``threshold`` (absolute; off by default), or when it
is above ``factor`` x the median of the last ``window`` good records (default
3 x the median of 10; active once 3 good records exist, so the fast fall at
the start of training never looks like a spike). A median follows the trend of
a falling loss while ignoring single outliers; relative to it, 3x is far
outside the noise of a mean over a logging window, and one bad record is not
enough: ``patience`` (default 2) bad records in a row are. A good record in
between resets the count. When the run is about to end or stop
(``max_steps`` reached, ``state.should_stop`` set) one bad record is enough.

What a rollback does, at the ``patience``-th bad record (step D):

1. Picks the newest checkpoint at or before the last good record (step G),
   among those this run lineage saved (``on_save_end``; a resumed run counts
   the checkpoint it resumed from), so the spike's updates are not in it
   (step C <= G). Damaged ones are skipped with a warning. Every rank waits for
   rank 0's checkpoint writer and meets at a barrier first, so all ranks see
   the same files.
2. Restores the model and the optimizer (weights and moments) from it with
   ``Trainer.load_checkpoint``, then puts back everything else as it was at
   step D: the step counters and data position, the learning-rate schedule's
   position, the RNG streams, every callback's state and the log history.
3. So training goes on with the batches after step D: the batches of steps
   C+1 .. D, the spike's and the ones the checkpoint lacks, are skipped. They
   count as skipped optimizer steps (``state.skipped_steps``), global_step
   keeps counting, so the schedule, ``max_steps``, logs and curves stay
   aligned with the data position and resuming stays exact. No batch is
   replayed and the trainer needs no rewind; the price is that the good
   batches between C and G are skipped too (save more often to keep C close
   to G). This is the recipe large-model teams apply by hand (PaLM: restart
   about 100 steps before the spike and skip 200-500 batches).
4. Multiplies the learning rate by ``lr_factor`` when set (the schedule's
   base: ``base_lr`` of a ``paddle.optimizer.lr.LRScheduler``, ``lr_scale`` of
   ``trainer.optim.schedules.WithWarmup``, the optimizer's own float LR when there
   is no scheduler). The cumulative factor is saved with this callback's state
   and re-applied when a run resumes.
5. Adds the rollback to the current log record (``rollback``,
   ``rollback_to_step``, ``rollback_skipped_steps``,
   ``rollback_skipped_samples``, ``rollback_lr_scale``; the loggers, order
   100, write them to metrics.jsonl), logs a warning on rank 0 naming the
   steps and samples skipped, appends the details to ``rollbacks``, and asks
   for a checkpoint at step D (``state.should_save``), so a crash afterwards
   resumes from the recovered weights and ``latest`` moves past any
   checkpoint written during the spike.

At most ``max_retries`` rollbacks per run (default 3); the next persistent
spike raises :class:`trainer.errors.TrainingError` naming the steps, the
losses and what to try. So does a spike with no usable checkpoint before it.
While a record is bad, a save due at that step is dropped
(``state.should_save`` cleared), so bad weights are not written as a good
checkpoint; a save due at a step that does not log cannot be judged: use a
``save_steps`` that is a multiple of ``logging_steps``. Keep more than one
checkpoint (``save_total_limit`` >= 2) so one from before the spike survives.
With ``NaNGuard`` the two divide the work: NaNGuard drops single non-finite
steps, LossSpikeRecovery handles a loss that stays bad.

Events: ``on_fit_begin`` (check that checkpoints are saved, restore the LR
factor), ``on_log`` (judge the record, roll back), ``on_save_end`` (note the
checkpoints of this run). Options: ``threshold``, ``factor``, ``window``,
``patience``, ``max_retries``, ``lr_factor``. State saved: recent good losses,
the pending bad records, the last good step, the steps this run saved,
the number of rollbacks, the cumulative LR factor and the record of each
rollback (``rollbacks``: detected step, first bad step, checkpoint step,
skipped steps and samples, losses, LR scale).

    >>> r = LossSpikeRecovery(patience=3, lr_factor=0.5)
    >>> r.is_bad(float("nan")), r.is_bad(1.0)
    ('not finite (nan)', None)
"""

from __future__ import annotations

import copy
import logging
import math
import os
import statistics
import weakref
from typing import List, Optional

from paddle.optimizer.lr import LRScheduler

from trainer import distributed as dist
from trainer.checkpoint import rng
from trainer.checkpoint.manifest import checkpoints_dir, verify
from trainer.checkpoint.store import list_checkpoints
from trainer.errors import ConfigError, DataError, TrainingError, option
from trainer.optim.schedules import WithWarmup

from .base import Callback

logger = logging.getLogger("callbacks.spike_recovery")
MIN_HISTORY = 3  # good records needed before the relative test applies


def _positive(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0


class LossSpikeRecovery(Callback):
    order = 30  # before the monitors (90) and loggers (100): they write the rollback figures it adds

    def __init__(self, threshold: Optional[float] = None, factor: Optional[float] = 3.0, window: int = 10,
                 patience: int = 2, max_retries: int = 3, lr_factor: Optional[float] = None):
        if threshold is not None and not (not isinstance(threshold, bool) and isinstance(threshold, (int, float))
                                          and math.isfinite(threshold)):
            raise ConfigError(f"LossSpikeRecovery(threshold={threshold!r}) is not allowed: give a finite loss value or None")
        if factor is not None and not (_positive(factor) and factor > 1):
            raise ConfigError(f"LossSpikeRecovery(factor={factor!r}) is not allowed: give a number > 1 or None")
        for name, value, low in (("window", window, MIN_HISTORY), ("patience", patience, 1), ("max_retries", max_retries, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"LossSpikeRecovery({name}={value!r}) is not allowed: give an integer >= {low}")
        if lr_factor is not None and not (_positive(lr_factor) and lr_factor < 1):
            raise ConfigError(f"LossSpikeRecovery(lr_factor={lr_factor!r}) is not allowed: give a number in (0, 1) or None")
        self.threshold = None if threshold is None else float(threshold)
        self.factor = None if factor is None else float(factor)
        self.window = window
        self.patience = patience
        self.max_retries = max_retries
        self.lr_factor = None if lr_factor is None else float(lr_factor)
        self._applied = None  # (weakref to the scheduler/optimizer, the LR scale already applied to it)
        self._reset()

    def _reset(self) -> None:
        self.recent: List[float] = []        # the last `window` good losses
        self.bad: List[list] = []            # [step, loss or None] of the current run of bad records
        self.last_good_step: Optional[int] = None
        self.saved_steps: List[int] = []     # checkpoints this lineage wrote under output_dir/checkpoints
        self.retries = 0
        self.lr_scale = 1.0
        self.rollbacks: List[dict] = []

    # ---- judging ------------------------------------------------------------------
    def is_bad(self, loss: float) -> Optional[str]:
        """Why ``loss`` is bad, or None when it is fine."""
        if not math.isfinite(loss):
            return f"not finite ({loss})"
        if self.threshold is not None and loss > self.threshold:
            return f"above the threshold {self.threshold:g}"
        if self.factor is not None and len(self.recent) >= MIN_HISTORY:
            median = statistics.median(self.recent)
            if loss > self.factor * median:
                return f"above {self.factor:g} x the running median {median:.4g}"
        return None

    # ---- events ---------------------------------------------------------------------
    def on_fit_begin(self, trainer):
        if trainer.args.save_strategy == "no":
            raise ConfigError("LossSpikeRecovery needs checkpoints to roll back to, but save_strategy='no': "
                              f"set {option('save_strategy', 'steps')} and {option('save_steps')} N (a multiple of logging_steps)")
        step = trainer.state.global_step
        if step == 0:
            self._reset()
        elif self.last_good_step is None:  # resumed from a checkpoint written without this callback
            self.last_good_step = step
        if step > 0 and step not in self.saved_steps:
            self.saved_steps.append(step)  # the checkpoint this run resumed from
        if self.last_good_step is None:
            self.last_good_step = step
        self._apply_lr_scale(trainer, probe=self.lr_factor is not None or self.lr_scale != 1.0)

    def on_save_end(self, trainer):
        state = trainer.state
        expected = os.path.join(checkpoints_dir(trainer.args.output_dir), f"step-{state.global_step}")
        if state.last_checkpoint and os.path.abspath(state.last_checkpoint) == os.path.abspath(expected):
            if state.global_step not in self.saved_steps:
                self.saved_steps.append(state.global_step)

    def on_log(self, trainer):
        state = trainer.state
        logs = state.logs
        if "loss" not in logs:  # evaluation records
            return
        loss = float(logs["loss"])
        why = self.is_bad(loss)
        if why is None:
            self.bad = []
            self.recent = (self.recent + [loss])[-self.window:]
            self.last_good_step = state.global_step
            return
        self.bad.append([state.global_step, loss if math.isfinite(loss) else None])
        state.should_save = False  # never publish the spike's weights as a checkpoint
        ending = state.global_step >= state.max_steps or state.should_stop
        if len(self.bad) < self.patience and not ending:
            if trainer.is_main_process:
                logger.warning("LossSpikeRecovery: loss %s at step %d is %s; %d more bad record(s) in a row and the "
                               "run rolls back", _fmt(loss), state.global_step, why, self.patience - len(self.bad))
            return
        self._rollback(trainer, why)

    # ---- the rollback -------------------------------------------------------------------
    def _rollback(self, trainer, why: str) -> None:
        state = trainer.state
        good, detected = self.last_good_step, state.global_step
        spike = f"steps {good + 1}-{detected}: {', '.join(_fmt(v) for _, v in self.bad)}"
        if self.retries >= self.max_retries:
            raise TrainingError(
                f"LossSpikeRecovery: the logged loss was {why} for {len(self.bad)} record(s) in a row ({spike}) after "
                f"{self.retries} rollback(s) (max_retries={self.max_retries}): lower learning_rate or set lr_factor, "
                "clip gradients with max_grad_norm, or check the data of these steps")
        trainer.wait_for_checkpoint()  # rank 0 may still be writing the checkpoint to come back to
        dist.barrier()                 # then every rank sees the same files
        path, step = self._pick_checkpoint(trainer, good)
        if path is None:
            raise TrainingError(
                f"LossSpikeRecovery: the logged loss was {why} ({spike}) but no checkpoint this run saved at or before "
                f"step {good} is left in {checkpoints_dir(trainer.args.output_dir)}: save more often "
                f"({option('save_steps')}, a multiple of logging_steps) and keep more ({option('save_total_limit')} 2 or more)")
        # what stays as it is at step D: progress, data position, schedule, RNG, callbacks, history
        keep_state = copy.deepcopy(state.state_dict())
        keep_callbacks = copy.deepcopy(trainer.callbacks.state_dict())
        scheduler = trainer.lr_scheduler
        keep_schedule = copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None
        keep_rng = rng.rng_state()
        trainer.load_checkpoint(path)  # the model and the optimizer are what we came for
        samples_at_checkpoint = state.samples_seen
        state.load_state_dict(keep_state)
        trainer.callbacks.load_state_dict(keep_callbacks)  # this one's too: then updated below
        if scheduler is not None:
            scheduler.set_state_dict(keep_schedule)
        rng.set_rng_state(keep_rng)

        skipped = detected - step
        samples = max(0, state.samples_seen - samples_at_checkpoint)
        state.skipped_steps += skipped
        self.retries += 1
        if self.lr_factor is not None:
            self.lr_scale *= self.lr_factor
            self._apply_lr_scale(trainer)
        record = {"retry": self.retries, "detected_step": detected, "first_bad_step": good + 1,
                  "checkpoint_step": step, "checkpoint": path, "skipped_steps": [step + 1, detected],
                  "skipped_samples": samples, "losses": [list(b) for b in self.bad], "reason": why,
                  "lr_scale": self.lr_scale}
        self.rollbacks.append(record)
        self.bad = []
        self.last_good_step = detected  # the weights at D are now the checkpoint's good ones
        self.saved_steps = [s for s in self.saved_steps if s <= step]  # the skipped stretch's checkpoints are void
        state.logs.update({"rollback": self.retries, "rollback_to_step": step, "rollback_skipped_steps": skipped,
                           "rollback_skipped_samples": samples, "rollback_lr_scale": self.lr_scale})
        state.should_save = trainer.args.save_strategy != "no"
        if trainer.is_main_process:
            logger.warning(
                "LossSpikeRecovery: the logged loss was %s for %d record(s) in a row (%s): rolled back to the checkpoint "
                "of step %d (%s) and skipped the batches of steps %d-%d (%d steps, %d samples)%s; rollback %d of at "
                "most %d", why, len(record["losses"]), spike, step, path, step + 1, detected, skipped, samples,
                f"; learning rate x{self.lr_scale:g} from now on" if self.lr_factor is not None else "",
                self.retries, self.max_retries)

    def _pick_checkpoint(self, trainer, last_good: int):
        """The newest verified checkpoint this lineage saved at or before ``last_good``: (path, step) or (None, None)."""
        ours = set(self.saved_steps)
        for path in list_checkpoints(trainer.args.output_dir):
            step = int(os.path.basename(path)[len("step-"):])
            if step > last_good or step not in ours:
                continue
            try:
                verify(path)
            except DataError as exc:
                if trainer.is_main_process:
                    logger.warning("LossSpikeRecovery: skipping checkpoint %s: %s", path, exc)
                continue
            return path, step
        return None, None

    # ---- learning rate ------------------------------------------------------------------
    def _apply_lr_scale(self, trainer, probe: bool = False) -> None:
        """Bring the LR's base to ``self.lr_scale`` (only the part not applied to this object yet)."""
        scheduler = trainer.lr_scheduler
        target = scheduler if scheduler is not None else trainer.optimizer
        applied = self._applied[1] if self._applied is not None and self._applied[0]() is target else 1.0
        change = self.lr_scale / applied
        if scheduler is None and probe:
            try:
                trainer.optimizer.set_lr(trainer.optimizer.get_lr())  # raises when the optimizer holds a scheduler
            except RuntimeError:
                raise ConfigError("LossSpikeRecovery(lr_factor=...) cannot lower a learning rate scheduled inside the "
                                  "optimizer: pass the scheduler as Trainer(lr_scheduler=...) too, or set lr_factor=None"
                                  ) from None
        if not math.isclose(change, 1.0, rel_tol=1e-12):
            if isinstance(scheduler, WithWarmup):
                scheduler.lr_scale *= change
            elif isinstance(scheduler, LRScheduler):
                scheduler.base_lr *= change
            if scheduler is not None:
                scheduler.step(scheduler.last_epoch)  # recompute the current value without advancing
            else:
                trainer.optimizer.set_lr(trainer.optimizer.get_lr() * change)
        self._applied = (weakref.ref(target), self.lr_scale)

    # ---- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"recent": list(self.recent), "bad": [list(b) for b in self.bad], "last_good_step": self.last_good_step,
                "saved_steps": list(self.saved_steps), "retries": self.retries, "lr_scale": self.lr_scale,
                "rollbacks": copy.deepcopy(self.rollbacks)}

    def load_state_dict(self, state: dict) -> None:
        self.recent = [float(v) for v in state.get("recent", [])]
        self.bad = [list(b) for b in state.get("bad", [])]
        self.last_good_step = state.get("last_good_step")
        self.saved_steps = [int(s) for s in state.get("saved_steps", [])]
        self.retries = int(state.get("retries", 0))
        self.lr_scale = float(state.get("lr_scale", 1.0))
        self.rollbacks = copy.deepcopy(state.get("rollbacks", []))

    def __repr__(self) -> str:
        return (f"LossSpikeRecovery(threshold={self.threshold}, factor={self.factor}, patience={self.patience}, "
                f"max_retries={self.max_retries}, lr_factor={self.lr_factor}, order={self.order})")


def _fmt(value) -> str:
    return "nan" if value is None else f"{value:.4g}"
