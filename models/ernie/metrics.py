"""Accuracy and macro-F1 for text classification.

The Trainer gathers predictions and labels from every rank, in dataset order
and without padding duplicates, before it calls ``compute_metrics``; so these
numpy functions see the whole evaluation set once, on any number of processes.

    >>> import numpy as np
    >>> from trainer import EvalPrediction
    >>> logits = np.array([[2.0, 0.0], [0.0, 1.0], [0.0, 3.0], [1.0, 0.0]])
    >>> m = classification_metrics(EvalPrediction(logits, np.array([0, 1, 0, 0])))
    >>> round(m["accuracy"], 3), round(m["macro_f1"], 3)
    (0.75, 0.733)
"""

from __future__ import annotations

import numpy as np


def macro_f1(pred: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """Unweighted mean over classes of F1; a class absent from both labels and predictions is skipped."""
    scores = []
    for c in range(num_classes):
        tp = int(np.sum((pred == c) & (labels == c)))
        fp = int(np.sum((pred == c) & (labels != c)))
        fn = int(np.sum((pred != c) & (labels == c)))
        if tp + fp + fn == 0:
            continue
        scores.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores)) if scores else 0.0


def classification_metrics(eval_pred) -> dict:
    """``{"accuracy", "macro_f1"}`` from logits ``[N, C]`` and labels ``[N]``."""
    logits = np.asarray(eval_pred.predictions)
    labels = np.asarray(eval_pred.label_ids).reshape(-1)
    pred = logits.argmax(-1).reshape(-1)
    return {"accuracy": float(np.mean(pred == labels)) if len(labels) else 0.0,
            "macro_f1": macro_f1(pred, labels, int(logits.shape[-1]))}
