"""Stratified train/val/test splits: scikit-learn's ``train_test_split``, remembered on disk.

Importing scikit-learn's model selection costs about 2.5 s of CPU (it loads SciPy), more than
importing paddle; a run of the digits demo used to spend a third of its time there. A split is a
function of the labels, the fractions, the seed and scikit-learn's version, so its indices are
kept in ``PTRAIN_CACHE_DIR`` (default ``$XDG_CACHE_HOME/ptrain``, else ``~/.cache/ptrain``) under
a key of all four, and a later process reads them back (bitwise the split scikit-learn gives)
without importing scikit-learn. A cache that cannot be written or read is skipped.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from importlib import metadata
from typing import Tuple

import numpy as np

_VERSION = 1


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get("PTRAIN_CACHE_DIR") or os.path.join(base, "ptrain")


def stratified_split(labels: np.ndarray, val_fraction: float, test_fraction: float,
                     seed: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(train, val, test)`` index arrays, in the order ``train_test_split`` returns them: first the
    test share off all samples (none when ``test_fraction`` is 0), then the validation share off
    the rest, each stratified by ``labels`` with ``random_state=seed``."""
    labels = np.ascontiguousarray(labels)
    key = hashlib.sha256(f"v{_VERSION}|{_sklearn_version()}|{val_fraction!r}|{test_fraction!r}|{seed}|"
                         f"{labels.dtype.str}|{labels.shape}|".encode() + labels.tobytes()).hexdigest()[:24]
    path = os.path.join(cache_dir(), f"split-{key}.npz")
    try:
        with np.load(path) as z:
            return z["train"], z["val"], z["test"]
    except (OSError, ValueError, KeyError):
        pass
    parts = _split(labels, val_fraction, test_fraction, seed)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, train=parts[0], val=parts[1], test=parts[2])
        os.replace(tmp, path)  # a reader never sees half a file; two writers write the same bytes
    except OSError:
        pass  # a read-only home: split again next time
    return parts


def _split(labels, val_fraction, test_fraction, seed):
    from sklearn.model_selection import train_test_split

    index = np.arange(len(labels))
    rest, test = (index, index[:0]) if test_fraction == 0 else train_test_split(
        index, test_size=test_fraction, random_state=seed, stratify=labels)
    val_share = val_fraction / (1.0 - test_fraction)
    train, val = train_test_split(rest, test_size=val_share, random_state=seed, stratify=labels[rest])
    return train, val, test


def _sklearn_version() -> str:
    try:
        return metadata.version("scikit-learn")
    except metadata.PackageNotFoundError:
        return "none"
