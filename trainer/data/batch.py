"""What a batch holds: its size and labels (read without touching the device), and a batch that a
dataset assembled itself (:class:`AssembledBatch`, its arrays from :func:`batch_array`) with the
collate step that uses it as it is."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
from paddle.io.dataloader.collate import default_collate_fn

_memory = threading.local()  # .writer: the SlotWriter of the batch a DataLoader worker is fetching


class AssembledBatch(list):
    """What a dataset's ``__getitems__(indices)`` may return when it has built the batch itself: the
    samples, a list as usual, plus ``batch``, exactly what ``default_collate_fn(samples)`` would give
    (e.g. images written straight into one preallocated ``(B, C, H, W)`` array, with the samples
    views of it). :func:`default_collate` hands ``batch`` on without copying it again; a
    ``collate_fn`` of your own gets the list of samples, as with any dataset."""

    def __init__(self, samples, batch):
        super().__init__(samples)
        self.batch = batch


def batch_array(shape, dtype) -> np.ndarray:
    """An uninitialized array for a batch that a dataset assembles itself (:class:`AssembledBatch`):
    ``np.empty``, except while a DataLoader worker of ``trainer.data.make_loader`` fetches the batch,
    when it is memory of the shared-memory slot the batch travels to the training process in
    (``trainer.data.worker_batches``): the batch is then written once, in place, and not copied again."""
    writer = getattr(_memory, "writer", None)
    array = writer.array(shape, dtype) if writer is not None else None
    return np.empty(shape, dtype) if array is None else array


@contextlib.contextmanager
def batch_memory(writer):
    """:func:`batch_array` hands out ``writer.array(...)`` in this block (None: ``np.empty``)."""
    previous, _memory.writer = getattr(_memory, "writer", None), writer
    try:
        yield
    finally:
        _memory.writer = previous


def default_collate(samples):
    """paddle's ``default_collate_fn``, except that an :class:`AssembledBatch` is its own batch."""
    if isinstance(samples, AssembledBatch):
        return samples.batch
    return default_collate_fn(samples)


def labels_of(batch: Any, keys=("labels",)):
    """The labels ``trainer.loss.forward`` uses: a mapping's label key (a tuple for several ``keys``), the last
    item of a sequence of 2+; None when absent."""
    if isinstance(batch, Mapping):
        found = [batch[k] for k in keys if k in batch]
        if not found:
            return None
        return found[0] if len(keys) == 1 else tuple(found)
    if isinstance(batch, (list, tuple)) and len(batch) > 1:
        return batch[-1]
    return None


def batch_size(batch: Any) -> int:
    """Rows in a batch, from tensor metadata (no device sync)."""
    if isinstance(batch, Mapping):
        batch = next(iter(batch.values()))
    if isinstance(batch, (list, tuple)):
        batch = batch[0]
        if isinstance(batch, (list, tuple, dict)):
            return batch_size(batch)
    return int(batch.shape[0]) if hasattr(batch, "shape") and len(batch.shape) else 1
