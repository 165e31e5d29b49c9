"""The scikit-learn digits, split train/val/test with a fixed seed, stratified by label."""

from __future__ import annotations

from typing import Tuple

import numpy as np
import paddle


class ArrayDataset(paddle.io.Dataset):
    """(features float32, label int64) pairs from two arrays."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x = np.ascontiguousarray(x, dtype="float32")
        self.y = np.ascontiguousarray(y, dtype="int64")

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def load_splits(val_fraction: float = 0.15, test_fraction: float = 0.15,
                seed: int = 0) -> Tuple[ArrayDataset, ArrayDataset, ArrayDataset]:
    """Pixels scaled to [0, 1], flattened to 64 features; same split for the same seed."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = digits.data.astype("float32") / 16.0
    y = digits.target.astype("int64")
    x_rest, x_test, y_rest, y_test = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    val_share = val_fraction / (1.0 - test_fraction)
    x_train, x_val, y_train, y_val = train_test_split(x_rest, y_rest, test_size=val_share, random_state=seed, stratify=y_rest)
    return ArrayDataset(x_train, y_train), ArrayDataset(x_val, y_val), ArrayDataset(x_test, y_test)
