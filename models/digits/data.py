"""The scikit-learn digits, split train/val/test with a fixed seed, stratified by label."""

from __future__ import annotations

import gzip
import importlib.util
import os
from typing import Tuple

import numpy as np
import paddle

from models.splits import stratified_split


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
    """Pixels scaled to [0, 1], flattened to 64 features; same split for the same seed
    (scikit-learn's stratified ``train_test_split``, cached: :mod:`models.splits`)."""
    pixels, labels = digits_arrays()
    x = pixels.astype("float32") / 16.0
    train, val, test = stratified_split(labels, val_fraction, test_fraction, seed)
    return ArrayDataset(x[train], labels[train]), ArrayDataset(x[val], labels[val]), ArrayDataset(x[test], labels[test])


def digits_arrays() -> Tuple[np.ndarray, np.ndarray]:
    """``sklearn.datasets.load_digits()``'s ``data`` (1797 x 64 float64, 0..16) and ``target`` (int64),
    read from the file scikit-learn ships without importing scikit-learn (2.5 s of CPU)."""
    spec = importlib.util.find_spec("sklearn")  # finds the package, runs none of it
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") if spec else ""
    if not os.path.isfile(path):  # another layout: scikit-learn's own loader
        from sklearn.datasets import load_digits

        digits = load_digits()
        return digits.data, digits.target.astype("int64")
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    return table[:, :-1], table[:, -1].astype("int64")
