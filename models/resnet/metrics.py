"""Top-1 and top-5 accuracy over a whole evaluation set.

The Trainer gathers the logits and labels of every rank, in dataset order and
without padding duplicates, before it calls ``compute_metrics``; so plain numpy
on the gathered arrays is exact with any number of ranks and uneven shards.

A sample counts for top-k when fewer than k classes score strictly higher than
its label (ties go to the sample, and no sort is needed)::

    >>> import numpy as np
    >>> from trainer import EvalPrediction
    >>> logits = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]])
    >>> classification_metrics(EvalPrediction(logits, np.array([2, 0])), k=2)
    {'accuracy': 0.5, 'top2_accuracy': 1.0}
"""

from __future__ import annotations

import functools

import numpy as np


def topk_accuracy(logits: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Share of rows whose label is among the ``k`` highest scores."""
    logits = np.asarray(logits)
    labels = np.asarray(labels).reshape(-1).astype("int64")
    if logits.ndim != 2 or logits.shape[0] != labels.shape[0]:
        raise ValueError(f"logits of shape {logits.shape} do not match {labels.shape[0]} labels")
    if labels.size == 0:
        return 0.0
    own = logits[np.arange(labels.shape[0]), labels][:, None]
    rank = (logits > own).sum(axis=1)  # classes scoring strictly higher than the label
    return float((rank < k).mean())


def classification_metrics(pred, k: int = 5) -> dict:
    """``accuracy`` (top-1) and ``top{k}_accuracy``; the Trainer prefixes ``eval_`` / ``test_``.
    With k or fewer classes, top-k is 1.0 by definition (the key stays the same)."""
    logits, labels = pred.predictions, pred.label_ids
    return {"accuracy": topk_accuracy(logits, labels, 1), f"top{k}_accuracy": topk_accuracy(logits, labels, k)}


def metrics_fn(k: int = 5):
    """``compute_metrics`` for the Trainer with top-``k``."""
    return functools.partial(classification_metrics, k=k)
