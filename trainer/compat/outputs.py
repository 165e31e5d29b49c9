"""What ``compute_metrics``, ``predict()`` and ``train()`` return: named tuples,
so both ``out.predictions`` and ``preds, labels, metrics = out`` work, as in
PaddleNLP and Hugging Face::

    >>> import numpy as np
    >>> preds, labels = EvalPrediction(np.zeros((2, 3)), np.array([0, 1]))
    >>> TrainOutput(10, 0.5, {"train_loss": 0.5}).training_loss
    0.5
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional


class EvalPrediction(NamedTuple):
    """What ``compute_metrics`` receives: numpy arrays over the whole dataset, in order."""

    predictions: Any
    label_ids: Any


class PredictionOutput(NamedTuple):
    """``predict()``'s result: predictions, labels (None without labels) and metrics."""

    predictions: Any
    label_ids: Optional[Any]
    metrics: dict


class TrainOutput(NamedTuple):
    """``train()``'s result: the last global step, the mean training loss of this run and its metrics."""

    global_step: int
    training_loss: float
    metrics: dict
