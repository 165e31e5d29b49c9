"""What a batch holds: its size and labels (read without touching the device), and a batch that a
dataset assembled itself (:class:`AssembledBatch`) with the collate step that uses it as it is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paddle.io.dataloader.collate import default_collate_fn


class AssembledBatch(list):
    """What a dataset's ``__getitems__(indices)`` may return when it has built the batch itself: the
    samples, a list as usual, plus ``batch``, exactly what ``default_collate_fn(samples)`` would give
    (e.g. images written straight into one preallocated ``(B, C, H, W)`` array, with the samples
    views of it). :func:`default_collate` hands ``batch`` on without copying it again; a
    ``collate_fn`` of your own gets the list of samples, as with any dataset."""

    def __init__(self, samples, batch):
        super().__init__(samples)
        self.batch = batch


def default_collate(samples):
    """paddle's ``default_collate_fn``, except that an :class:`AssembledBatch` is its own batch."""
    if isinstance(samples, AssembledBatch):
        return samples.batch
    return default_collate_fn(samples)


def labels_of(batch: Any, keys=("labels",)):
    """The labels ``Trainer._forward`` uses: a mapping's label key (a tuple for several ``keys``), the last
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
