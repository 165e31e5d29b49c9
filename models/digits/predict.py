"""``ptrain predict digits --model RUN/inference INPUT...``: classify 8x8 digits with the exported MLP.

An INPUT is a file:

- ``.npy``, ``.txt`` or ``.csv``: 64 numbers (an 8x8 array or a flat row), on scikit-learn's scale
  0..16 (as ``sklearn.datasets.load_digits().data``) or already in [0, 1];
- an image (PNG, JPEG, ...): turned to grey, shrunk to 8x8 (area average) and scaled to [0, 1]; a
  dark digit on light paper is inverted first (the scans the model learned from are light on dark).

Each answer is ``{"input": FILE, "label": DIGIT, "score": P, "top3": [[DIGIT, P], ...]}``.
"""

from __future__ import annotations

import os
from typing import List

import numpy as np

from trainer.deploy.predictor import create_predictor, run_predictor
from trainer.errors import ConfigError, DataError

ARRAY_SUFFIXES = (".npy", ".txt", ".csv")


def read_digit(path: str) -> np.ndarray:
    """The 64 float32 features in [0, 1] the model takes, from an array file or an image."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path} does not exist: give 8x8 digit files (.npy, .txt, .csv or an image)")
    if path.lower().endswith(ARRAY_SUFFIXES):
        try:
            if path.lower().endswith(".npy"):
                values = np.load(path, allow_pickle=False)
            else:
                values = np.loadtxt(path, delimiter="," if path.lower().endswith(".csv") else None)
        except (OSError, ValueError) as exc:
            raise DataError(f"{path} cannot be read as numbers ({exc}): give 64 numbers, 0..16 or 0..1") from None
        values = np.asarray(values, dtype="float32").reshape(-1)
        if values.size != 64:
            raise DataError(f"{path} holds {values.size} numbers: a digit is 64 (8x8), 0..16 or 0..1")
        if not np.isfinite(values).all() or values.min() < 0 or values.max() > 16:
            raise DataError(f"{path} has values outside 0..16: give scikit-learn's scale 0..16 or 0..1")
        return values / 16.0 if values.max() > 1 else values
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            grey = np.asarray(image.convert("L").resize((8, 8), Image.BOX), dtype="float32") / 255.0
    except (OSError, UnidentifiedImageError) as exc:
        raise DataError(f"{path} is not an image nor an array file ({exc}): give .npy, .txt, .csv or an image") from None
    if grey.mean() > 0.5:  # light paper: the digit is the dark part
        grey = 1.0 - grey
    return grey.reshape(-1)


def predict(model_dir: str, inputs: List[str]) -> List[dict]:
    """Files of 64 numbers (.npy, .txt, .csv; 0..16 as scikit-learn's digits, or 0..1) or small images of a
    digit (any size; dark on light is inverted), each answered with the digit and its probability."""
    features = np.stack([read_digit(p) for p in inputs])
    (logits,) = run_predictor(create_predictor(model_dir), [features])
    z = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    rows = []
    for path, p in zip(inputs, probs):
        top = np.argsort(-p)[:3]
        rows.append({"input": path, "label": int(top[0]), "score": round(float(p[top[0]]), 6),
                     "top3": [[int(i), round(float(p[i]), 6)] for i in top]})
    return rows
