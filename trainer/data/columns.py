"""``remove_unused_columns``: drop the keys of mapping samples that the model's
``forward`` does not take, before they are collated (as PaddleNLP does), so a
dataset may carry raw columns (``sentence``, ``idx``) next to the model's
inputs. Label keys are always kept (``labels``, ``label``, ``label_ids``,
``start_positions``, ``end_positions`` and ``args.label_names``). Nothing is
dropped when ``forward`` takes ``**kwargs``, or for samples that are not
mappings (tuples pass through).

    >>> import paddle
    >>> class Net(paddle.nn.Layer):
    ...     def forward(self, input_ids, labels=None):
    ...         return input_ids
    >>> keep = model_columns(Net(), label_names=None)
    >>> sorted(ColumnFilter(keep, None).strip({"input_ids": 1, "labels": 0, "sentence": "hi"}))
    ['input_ids', 'labels']
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Callable, Iterable, Optional

from .batch import default_collate

LABEL_KEYS = ("labels", "label", "label_ids", "start_positions", "end_positions")


def model_columns(model, label_names: Optional[Iterable[str]]) -> Optional[frozenset]:
    """The keys ``model.forward`` takes plus the label keys; None when it takes ``**kwargs``."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset([p.name for p in params] + list(LABEL_KEYS) + list(label_names or ()))


class ColumnFilter:
    """A collate function that first drops unused keys of mapping samples (picklable for workers)."""

    def __init__(self, keep: frozenset, collate_fn: Optional[Callable]):
        self.keep = keep
        self.collate_fn = collate_fn or default_collate

    def strip(self, sample):
        if isinstance(sample, Mapping) and any(k not in self.keep for k in sample):
            return {k: v for k, v in sample.items() if k in self.keep}
        return sample

    def __call__(self, samples):
        if samples and not isinstance(samples[0], Mapping):  # tuples pass through: no per-sample check
            return self.collate_fn(samples)
        return self.collate_fn([self.strip(s) for s in samples])


def collate_for(model, args, collate_fn: Optional[Callable]) -> Optional[Callable]:
    """``collate_fn`` wrapped in a :class:`ColumnFilter` when ``args.remove_unused_columns``."""
    if not args.remove_unused_columns:
        return collate_fn
    keep = model_columns(model, args.label_names)
    return collate_fn if keep is None else ColumnFilter(keep, collate_fn)
