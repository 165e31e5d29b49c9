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
(``state.run_id``, recorded in each manifest); it keeps the newest ``save_total_limit`` complete checkpoints plus the
best ``best_k``. It runs only once the newest checkpoint is complete and
published (before the next save starts, and at the end of fit(), after waiting
for a background write), and never deletes the newest complete checkpoint, so
a failed save can never cost a good one.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Optional

from trainer.checkpoint.manifest import MANIFEST, checkpoints_dir
from trainer.checkpoint.store import list_checkpoints
from trainer.errors import TrainingError
from trainer.metric_keys import metric_key

from .base import Callback

logger = logging.getLogger("callbacks.checkpoint")


class Checkpoint(Callback):
    order = 200

    def __init__(self, best_k: int = 1):
        self.best_k = best_k
        self.best = []  # [(value, step)], best first

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
        self.rotate(trainer.args.output_dir, trainer.args.save_total_limit, keep, run_id=trainer.state.run_id)

    @staticmethod
    def rotate(output_dir: str, keep_last: int, keep=(), run_id: Optional[str] = None) -> list:
        """Delete complete checkpoints older than the newest ``keep_last``, except the names in ``keep``;
        return the deleted names. With ``run_id``, only that run's checkpoints are counted or deleted.
        A checkpoint that cannot be removed (read-only directory) is a save failure (TrainingError)."""
        root = checkpoints_dir(output_dir)
        complete = [os.path.basename(p) for p in list_checkpoints(output_dir, run_id=run_id)  # newest first
                    if os.path.isfile(os.path.join(p, MANIFEST))]
        keep = set(complete[:keep_last]) | set(keep)
        deleted = []
        for name in complete[1:]:  # the newest is never deleted
            if name not in keep:
                trash = os.path.join(root, f".deleting-{name}")
                try:
                    os.rename(os.path.join(root, name), trash)  # vanish atomically, then delete
                except OSError as exc:
                    raise TrainingError(f"cannot remove old checkpoint {os.path.join(root, name)} ({exc.strerror}): "
                                        f"make {root} writable or raise --save_total_limit") from None
                shutil.rmtree(trash, ignore_errors=True)
                deleted.append(name)
        if deleted:
            logger.debug("removed old checkpoints: %s", ", ".join(deleted))  # --verbose shows it
        return deleted

    def state_dict(self):
        return {"best": [[value, step] for value, step in self.best]}

    def load_state_dict(self, state):
        self.best = [(value, step) for value, step in state.get("best", [])]
