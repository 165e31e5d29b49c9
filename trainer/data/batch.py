"""What the loop reads off a batch without touching the device: its size and its labels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
