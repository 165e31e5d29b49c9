"""LoadBestModel: after training, put the best checkpoint's weights in the model.

Switched on by ``args.load_best_model_at_end`` (``callbacks.defaults``). The
best checkpoint is the one ``Checkpoint`` recorded in
``state.best_checkpoint`` by ``args.metric_for_best_model``
(``TrainingArguments`` makes sure a checkpoint is written at every
evaluation). Events: ``on_fit_end`` (any status but failed: completed, stopped
or preempted; every rank
loads, so all ranks end with the same weights). Only the model's weights are
loaded; optimizer and state stay those of the last step. State saved: none.
"""

from __future__ import annotations

import logging

from .base import Callback

logger = logging.getLogger("trainer")


class LoadBestModel(Callback):
    order = 210  # after Checkpoint (200), which rotates old checkpoints but keeps the best

    def on_fit_end(self, trainer):
        state = trainer.state
        if state.status == "failed":
            return
        path = state.best_checkpoint
        if not path:
            if trainer.is_main_process:
                logger.warning("load_best_model_at_end: no best checkpoint was recorded (no evaluation with a "
                               "checkpoint at its step); the model keeps the weights of the last step")
            return
        from trainer.checkpoint.load import load_model_weights

        trainer.wait_for_checkpoint()
        load_model_weights(trainer, path)  # verified; any layout; a LoRA model's adapter into its inner model
        if trainer.is_main_process:
            logger.info("load_best_model_at_end: loaded %s (%s = %s)", path, trainer.args.metric_for_best_model,
                        state.best_metric)
