"""Checkpoint: tracks the best checkpoint and rotates old ones.

When to save is decided by ``FlowControl`` (``save_strategy``/``save_steps``)
or any callback setting ``state.should_save``; ``Trainer.save_checkpoint``
does the complete-or-nothing write (``trainer.checkpoint_io``). This callback
owns what happens around it.

Events: ``on_eval_end`` (compare ``args.metric_for_best_model`` with the best
so far; ``args.greater_is_better`` or the metric's name decides the
direction), ``on_save_end`` (record ``state.best_checkpoint``; delete
checkpoints beyond ``args.save_total_limit``, rank 0 only). Options: from
``trainer.args``. State saved: the step of the best evaluation.

Rotation keeps the newest ``save_total_limit`` complete checkpoints plus the
best one; it runs only after a new checkpoint is complete and published, and
never deletes the newest, so a failed save can never cost a good checkpoint.
"""

from __future__ import annotations

import logging
import os
import re
import shutil

from .base import Callback

logger = logging.getLogger("callbacks.checkpoint")
_STEP = re.compile(r"^step-(\d+)$")


class Checkpoint(Callback):
    order = 200

    def __init__(self):
        self.best_step = None

    def on_eval_end(self, trainer):
        name = trainer.args.metric_for_best_model
        if not name or name not in trainer.state.metrics:
            return
        value = trainer.state.metrics[name]
        best = trainer.state.best_metric
        better = trainer.args.greater_is_better_resolved
        if best is None or (value > best if better else value < best):
            trainer.state.best_metric = value
            self.best_step = trainer.state.global_step

    def on_save_end(self, trainer):
        state = trainer.state
        if self.best_step == state.global_step and state.last_checkpoint:
            state.best_checkpoint = state.last_checkpoint
        root = os.path.join(trainer.args.output_dir, "checkpoints")
        standard = os.path.dirname(os.path.abspath(state.last_checkpoint or "")) == os.path.abspath(root)
        if trainer.is_main_process and trainer.args.save_total_limit and standard:
            self.rotate(root, trainer.args.save_total_limit, state.best_checkpoint)

    @staticmethod
    def rotate(root: str, keep_last: int, best: str = None) -> list:
        """Delete complete checkpoints older than the newest ``keep_last`` (never ``best``); return the deleted."""
        steps = sorted((int(m.group(1)), name) for name in os.listdir(root)
                       if (m := _STEP.match(name)) and os.path.isfile(os.path.join(root, name, "manifest.json")))
        keep = {name for _, name in steps[-keep_last:]}
        if best:
            keep.add(os.path.basename(best.rstrip("/")))
        deleted = []
        for _, name in steps[:-1]:  # the newest is never deleted
            if name not in keep:
                trash = os.path.join(root, f".deleting-{name}")
                os.rename(os.path.join(root, name), trash)  # vanish atomically, then delete
                shutil.rmtree(trash, ignore_errors=True)
                deleted.append(name)
        if deleted:
            logger.info("removed old checkpoints: %s", ", ".join(deleted))
        return deleted

    def state_dict(self):
        return {"best_step": self.best_step}

    def load_state_dict(self, state):
        self.best_step = state.get("best_step")
