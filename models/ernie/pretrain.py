"""Masked-LM warm start for from-scratch models: ERNIE's pretrain-then-finetune, in miniature.

Before fine-tuning, ``mlm_pretrain_epochs`` epochs of masked-language-model
training on the *training split's* texts only (never dev or test), with the
same Trainer: 15 % of the non-special tokens of each text are chosen; of those
80 % become ``[MASK]``, 10 % a random token, 10 % stay; paddlenlp's
``ErnieForMaskedLM`` predicts the chosen tokens (its head runs only on the
chosen positions). The encoder weights (``ernie.*``) then seed the classifier.

:class:`MaskedLMWarmStart` runs this as a callback when ``fit()`` begins (so
``--dry_run`` builds the task without pretraining, and a resumed run, whose
weights come from its checkpoint, skips it).

    >>> import numpy as np
    >>> collator = MaskingCollator(vocab_size=50, seed=0)
    >>> batch = collator([(np.array([1, 10, 11, 12, 13, 2], "int32"), 0)], as_tensors=False)
    >>> sorted(batch), batch["labels"].shape == batch["masked_positions"].shape
    (['input_ids', 'labels', 'masked_positions', 'token_type_ids'], True)
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Optional

import numpy as np
import paddle

from callbacks.base import Callback

from .batching import PAD_ID

logger = logging.getLogger("trainer")

CLS_ID, SEP_ID, UNK_ID, MASK_ID = 1, 2, 3, 4
FIRST_ORDINARY_ID = 5


class MaskingCollator:
    """Pads like :func:`batching.collate` and masks tokens for the MLM loss.

    Each call draws from its own ``RandomState`` stream seeded once, so a run
    is repeatable; DataLoader workers (if any) each get a copy of the stream.
    """

    def __init__(self, vocab_size: int, mask_prob: float = 0.15, seed: int = 0):
        self.vocab_size = int(vocab_size)
        self.mask_prob = float(mask_prob)
        self.rng = np.random.RandomState(seed)

    def __call__(self, items, as_tensors: bool = True) -> dict:
        longest = max(len(ids) for ids, _ in items)
        input_ids = np.full((len(items), longest), PAD_ID, dtype="int64")
        for row, (ids, _) in enumerate(items):
            input_ids[row, :len(ids)] = ids
        ordinary = input_ids >= FIRST_ORDINARY_ID
        chosen = ordinary & (self.rng.rand(*input_ids.shape) < self.mask_prob)
        if not chosen.any():  # at least one target per batch: the first ordinary token
            rows, cols = np.nonzero(ordinary)
            if len(rows):
                chosen[rows[0], cols[0]] = True
            else:
                chosen[0, 0] = True
        positions = np.flatnonzero(chosen)            # flat b * T + t, as ErnieLMPredictionHead gathers
        labels = input_ids.reshape(-1)[positions].copy()
        draw = self.rng.rand(len(positions))
        flat = input_ids.reshape(-1)
        flat[positions[draw < 0.8]] = MASK_ID
        swap = positions[(draw >= 0.8) & (draw < 0.9)]
        flat[swap] = self.rng.randint(FIRST_ORDINARY_ID, self.vocab_size, size=len(swap))
        batch = {"input_ids": input_ids, "token_type_ids": np.zeros_like(input_ids),
                 "masked_positions": positions.astype("int64"), "labels": labels.astype("int64")}
        return {k: paddle.to_tensor(v) for k, v in batch.items()} if as_tensors else batch


def mlm_pretrain(config, train_dataset, args, epochs: float, learning_rate: Optional[float] = None,
                 callbacks=()) -> dict:
    """Train ``ErnieForMaskedLM(config)`` on ``train_dataset`` for ``epochs``; return its encoder weights.

    Runs the project's Trainer with the run's arguments, except: output in
    ``OUTPUT_DIR/mlm_pretrain``, no evaluation, no checkpoints, no resume.
    """
    from paddlenlp.transformers import ErnieForMaskedLM

    from trainer import Trainer

    paddle.seed(args.seed)
    model = ErnieForMaskedLM(config)
    mlm_args = dataclasses.replace(
        args, output_dir=os.path.join(args.output_dir, "mlm_pretrain"), num_train_epochs=float(epochs), max_steps=-1,
        learning_rate=float(learning_rate or args.learning_rate), evaluation_strategy="no", save_strategy="no",
        metric_for_best_model=None, resume_from_checkpoint=None)
    trainer = Trainer(model, mlm_args, train_dataset=train_dataset,
                      collate_fn=MaskingCollator(config.vocab_size, seed=args.seed), callbacks=list(callbacks))
    state = trainer.fit()
    losses = [r["loss"] for r in state.log_history if "loss" in r]
    if losses:
        logger.info("masked-LM warm start: %d steps, loss %.3f -> %.3f", state.global_step, losses[0], losses[-1])
    return {k: v for k, v in model.ernie.state_dict().items()}


class MaskedLMWarmStart(Callback):
    """Masked-LM pretraining of the classifier's encoder when ``fit()`` begins.

    Events: ``fit_begin`` (skipped when the run resumed: ``state.global_step > 0``).
    Options: ``config`` (the classifier's ErnieConfig), ``train_dataset``,
    ``epochs``, ``learning_rate`` (None: the run's), ``callbacks`` for the
    pretraining run (e.g. length bucketing). State: none. Order -10: before
    AMP (order 0) decorates the model, so the weights load into float32 layers.
    """

    order = -10

    def __init__(self, config, train_dataset, epochs: float, learning_rate: Optional[float] = None, callbacks=()):
        self.config = config
        self.train_dataset = train_dataset
        self.epochs = float(epochs)
        self.learning_rate = learning_rate
        self.callbacks = list(callbacks)

    def on_fit_begin(self, trainer):
        if trainer.state.global_step > 0 or self.epochs <= 0:
            return
        weights = mlm_pretrain(self.config, self.train_dataset, trainer.args, self.epochs, self.learning_rate,
                               callbacks=self.callbacks)
        trainer.model.ernie.set_state_dict(weights)
        if hasattr(self.train_dataset, "set_order"):
            self.train_dataset.set_order(None)
