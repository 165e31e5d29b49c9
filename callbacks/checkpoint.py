"""Checkpoint: tracks the best checkpoint and rotates old ones.

When to save is decided by ``FlowControl`` (``save_strategy``/``save_steps``)
or any callback setting ``state.should_save``; ``Trainer.save_checkpoint``
does the complete-or-nothing write (``trainer.checkpoint``). This callback
owns what happens around it.

Events: ``on_eval_end`` (compare ``args.metric_for_best_model`` with the best
so far; ``accuracy`` and ``eval_accuracy`` name the same metric, a name no
evaluation produces is a ConfigError listing the keys; ``args.greater_is_better``
or the metric's name decides the direction), ``on_save_end`` (record ``state.best_checkpoint``),
``on_save_begin`` and ``on_fit_end`` (rotate, rank 0 only). Options:
``best_k`` (keep the best K by the metric, default 1); the rest from
``trainer.args``. State saved: the best evaluations (step and value).

Rotation counts and deletes only the current run's checkpoints
(``state.run_id``, recorded in each manifest) whose files verify, in the order they
were saved (not by step number: after a resume from an earlier step, the new step-15
is newer than the abandoned step-20); it keeps the newest ``save_total_limit`` of them
plus the best ``best_k``. A damaged checkpoint is neither counted nor deleted. The
checkpoint this fit() resumed from is kept until one saved by this fit() verifies, and
``latest`` is moved to the newest kept one whenever it names a checkpoint that is gone
or damaged. Rotation runs only once the newest checkpoint is complete and published
(before the next save starts, and at the end of fit(), after waiting for a background
write), and never deletes the newest verified checkpoint, so a failed save can never
cost a good one. Each checkpoint is verified once per process (the writer's own hashes
count for the ones it wrote).
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Optional

from trainer.checkpoint import fence
from trainer.checkpoint.manifest import checkpoints_dir
from trainer.checkpoint.store import list_checkpoints, newest_saved_first, point_latest, read_latest, verifies
from trainer.errors import TrainingError
from trainer.metric_keys import metric_key

from .base import Callback

logger = logging.getLogger("callbacks.checkpoint")


class Checkpoint(Callback):
    order = 200

    def __init__(self, best_k: int = 1):
        self.best_k = best_k
        self.best = []  # [(value, step)], best first
        self._resumed = None  # the checkpoint this fit() resumed from (kept until a newer one verifies)
        self._saved = []      # the checkpoints this fit() saved

    def on_fit_begin(self, trainer):
        step = trainer.state.global_step
        self._resumed = f"step-{step}" if step > 0 else None
        self._saved = []

    def on_eval_end(self, trainer):
        name, metrics = trainer.args.metric_for_best_model, trainer.state.metrics
        if not name:
            return
        if trainer.state.status != "running":  # evaluate() outside fit(): not a candidate, never an error
            return
        key = metric_key(name, metrics)  # accuracy == eval_accuracy; an unknown name is an error listing the keys
        sign = -1.0 if trainer.args.greater_is_better_resolved else 1.0
        step = trainer.state.global_step
        self.best = sorted([b for b in self.best if b[1] != step] + [(float(metrics[key]), step)],
                           key=lambda b: sign * b[0])[: self.best_k]
        trainer.state.best_metric = self.best[0][0]

    def on_save_end(self, trainer):
        state = trainer.state
        if state.last_checkpoint:
            self._saved.append(os.path.basename(state.last_checkpoint))
        if self.best and self.best[0][1] == state.global_step and state.last_checkpoint:
            state.best_checkpoint = state.last_checkpoint

    def on_save_begin(self, trainer):
        self._rotate_published(trainer)

    def on_fit_end(self, trainer):
        if trainer.state.status != "failed":
            self._rotate_published(trainer)

    def _rotate_published(self, trainer):
        if not (trainer.is_main_process and trainer.args.save_total_limit):
            return
        trainer.wait_for_checkpoint()  # the newest must be complete before anything older goes
        keep = [f"step-{step}" for _, step in self.best]
        self.rotate(trainer.args.output_dir, trainer.args.save_total_limit, keep, run_id=trainer.state.run_id,
                    resumed=self._resumed, saved=self._saved)

    @staticmethod
    def rotate(output_dir: str, keep_last: int, keep=(), run_id: Optional[str] = None,
               resumed: Optional[str] = None, saved=()) -> list:
        """Delete verified checkpoints older (by save time) than the newest ``keep_last`` verified ones, except
        the names in ``keep``; return the deleted names. With ``run_id``, only that run's checkpoints are counted
        or deleted; damaged ones are never counted nor deleted. ``resumed`` (the checkpoint the run resumed
        from) is kept until one of ``saved`` (the checkpoints saved since) verifies.
        A checkpoint that cannot be removed (read-only directory) is a save failure (TrainingError)."""
        root = checkpoints_dir(output_dir)
        good = [os.path.basename(p) for p in newest_saved_first(list_checkpoints(output_dir, run_id=run_id))
                if verifies(p)]
        keep = set(good[:keep_last]) | set(keep)
        if resumed and not any(name in good for name in saved if name != resumed):
            keep.add(resumed)
        deleted = []
        for name in good[1:]:  # the newest verified is never deleted
            if name not in keep:
                trash = os.path.join(root, f".deleting-{name}")
                try:
                    with fence.fenced(output_dir):  # never another owner's checkpoint (a lease taken over)
                        os.rename(os.path.join(root, name), trash)  # vanish atomically, then delete
                except OSError as exc:
                    raise TrainingError(f"cannot remove old checkpoint {os.path.join(root, name)} ({exc.strerror}): "
                                        f"make {root} writable or raise --save_total_limit") from None
                shutil.rmtree(trash, ignore_errors=True)
                deleted.append(name)
        named = read_latest(output_dir)
        if good and (named is None or os.path.basename(named) in deleted or not os.path.isdir(named)
                     or (os.path.basename(named) not in good and not verifies(named))):
            point_latest(root, good[0])  # latest never names a missing or damaged checkpoint
            logger.warning("checkpoints/latest named %s, which is %s: it now names %s",
                           os.path.basename(named) if named else "nothing",
                           "missing" if named is None or not os.path.isdir(named) else "damaged", good[0])
        if deleted:
            logger.debug("removed old checkpoints: %s", ", ".join(deleted))  # --verbose shows it
        return deleted

    def state_dict(self):
        return {"best": [[value, step] for value, step in self.best]}

    def load_state_dict(self, state):
        self.best = [(value, step) for value, step in state.get("best", [])]
