"""Metric names and values: the one place where ``metric_for_best_model`` is
matched to an evaluation's keys, and where ``compute_metrics`` results are
turned into flat, prefixed floats.

``accuracy`` and ``eval_accuracy`` name the same metric (PaddleNLP adds the
``eval_`` prefix itself); ``Checkpoint``, ``EarlyStopping`` and
``load_best_model_at_end`` all resolve names here. A name that no evaluation
produces is a ConfigError listing the keys there are::

    >>> metric_key("accuracy", {"eval_loss": 0.3, "eval_accuracy": 0.9})
    'eval_accuracy'
    >>> flatten_metrics({"f1": {"macro": 0.5, "micro": 0.7}, "entities": 21}, "eval")
    {'eval_f1_macro': 0.5, 'eval_f1_micro': 0.7, 'eval_entities': 21}
"""

from __future__ import annotations

import numbers
from typing import Any, Mapping

import numpy as np

from .errors import ConfigError


def metric_key(name: str, metrics: Mapping[str, Any], prefix: str = "eval", owner: str = "metric_for_best_model") -> str:
    """The key of ``metrics`` that ``name`` means (``name`` itself, or ``prefix_name``)."""
    for key in (name, f"{prefix}_{name}"):
        if key in metrics:
            return key
    listed = sorted(k for k in metrics if not k.endswith(("_runtime", "_per_second")))  # timings rank nothing
    raise ConfigError(f"{owner} {name!r} is not in the evaluation metrics ({', '.join(listed) or 'none'}): "
                      f"use one of them, or return it from compute_metrics")


def flatten_metrics(values: Any, prefix: str) -> dict:
    """``compute_metrics``' result as ``{prefix_key[_subkey]: number}``; each key prefixed once.

    Nested mappings become ``<key>_<subkey>``; numbers (python, numpy, 0-d or
    one-element arrays and tensors) become Python numbers of their kind, as
    PaddleNLP's ``denumpify_detensorize`` leaves them: an integer stays an int
    (21, not 21.0), a bool a bool, a float a float; anything else is a
    ConfigError naming ``compute_metrics`` and the key.
    """
    if not isinstance(values, Mapping):
        raise ConfigError(f"compute_metrics returned {type(values).__name__}, not a dict of metric name -> number: "
                          "return e.g. {'accuracy': 0.93}")
    out: dict = {}
    for key, value in _flat_items(values, ""):
        out[key if key.startswith(prefix + "_") else f"{prefix}_{key}"] = _number(key, value)
    return out


def _flat_items(values: Mapping, parent: str):
    for key, value in values.items():
        name = f"{parent}_{key}" if parent else str(key)
        if isinstance(value, Mapping):
            yield from _flat_items(value, name)
        else:
            yield name, value


def _number(key: str, value: Any):
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Number) and not isinstance(value, complex):
        return float(value)
    size = getattr(value, "size", None)
    if callable(size):  # a paddle tensor's size is an attribute in paddle 3; guard older ones
        size = None
    if size == 1 and hasattr(value, "item"):
        item = value.item()
        if isinstance(item, (bool, numbers.Integral, numbers.Real)) and not isinstance(item, complex):
            return _number(key, item)
    raise ConfigError(f"compute_metrics returned {type(value).__name__} for {key!r}, not a number: "
                      "return numbers (or dicts of numbers) only")
