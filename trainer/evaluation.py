"""The inference loop of ``Trainer.evaluate`` and ``Trainer.predict``: batches in, outputs joined, gathered and
turned into metrics.

Each rank runs :meth:`Trainer.evaluation_step` over its contiguous, unpadded
shard (``trainer.data.ShardedEvalSampler``); ``preprocess_logits_for_metrics``
runs on each batch's outputs; the per-batch predictions and labels are joined on
the device (:func:`join_batches`), gathered across ranks in rank order (which
restores the dataset order), summed losses reduced, and only then copied to the
host once. No sample counts twice or is lost on uneven data.

With ``eval_accumulation_steps=N`` (PaddleNLP's and Hugging Face's field) the outputs joined so far move to the
host every N batches (:class:`_HostParts`), so a long evaluation's predictions do not pile up on the card; on
one process they never return to it. On several, the pass ends with one gather: each rank's joined outputs go
through the card once then (gloo and NCCL gather device tensors), as the gather without N does.

Batches may differ in every non-batch dimension (a collator that pads each batch
to its own longest sequence gives logits ``[32, 33, 5]`` then ``[32, 35, 5]``):
each part is padded to the longest with ``padding_index`` (-100, PaddleNLP's and
Hugging Face's, which their metrics and ``seqeval`` helpers skip) before joining,
and the gather across ranks pads the same way, so shard lengths and sequence
lengths may both differ between ranks::

    >>> a, b = paddle.ones([2, 3], "int64"), paddle.zeros([1, 4], "int64")
    >>> join_batches([a, b]).numpy().tolist()
    [[1, 1, 1, -100], [1, 1, 1, -100], [0, 0, 0, 0]]
"""

from __future__ import annotations

import math
import time
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import paddle

from . import distributed as dist
from .compat.outputs import EvalPrediction
from .data import close_iterator
from .data.batch import batch_size
from .errors import ConfigError, option
from .events import Event
from .metric_keys import flatten_metrics
from .tensors import PADDING_INDEX, pad_to, to_numpy  # to_numpy: bf16 -> float32 (numpy() of bf16 gives raw bits)


class InferenceOutput(NamedTuple):
    """What one pass of the inference loop gives, identical on every rank."""

    predictions: Any             # numpy (or a tuple/list of numpy), in dataset order
    label_ids: Any               # likewise, or None when the batches carry no labels
    loss_sum: Optional[float]    # the summed per-sample loss over the dataset; None when no batch gave a loss
    count: int                   # samples seen, over all ranks


def run_inference(trainer, dataset, begin: Optional[Event], end: Optional[Event]) -> InferenceOutput:
    """Run ``trainer.evaluation_step`` over ``dataset`` (firing ``begin``/``end`` around each batch when given)."""
    loader = trainer.eval_dataloader = trainer.get_eval_dataloader(dataset)
    model = trainer.model_wrapped if isinstance(trainer.model_wrapped, paddle.DataParallel) else trainer.inference_model
    was_training = model.training
    model.eval()
    loss_sum = paddle.zeros([], dtype="float64")
    has_loss, all_preds, all_labels, count = False, [], [], 0
    host = _HostParts(trainer.args.eval_accumulation_steps)
    batches = iter(loader)
    try:
        with paddle.no_grad():
            for batch in batches:
                if begin:
                    trainer.fire(begin)
                loss, preds, labels = trainer.evaluation_step(trainer.inference_model, batch)
                if trainer.preprocess_predictions is not None:  # e.g. argmax per batch: less to keep and gather
                    preds = trainer.preprocess_predictions(preds, labels)
                n = batch_size(batch)
                count += n
                if loss is not None:
                    has_loss = True
                    loss_sum += loss.astype("float64") * n
                all_preds.append(_detach(preds))
                if labels is not None:
                    all_labels.append(labels)
                all_preds, all_labels = host.maybe_move(all_preds, all_labels)
                if end:
                    trainer.fire(end)
    finally:
        close_iterator(batches)  # a read-ahead thread or DataLoader workers end with the pass, or with its failure
        if was_training:
            model.train()
    if host.parts:
        all_preds, all_labels = host.join(all_preds, all_labels, on_device=dist.get_world_size() > 1)
    local_preds = join_batches(all_preds)
    local_labels = join_batches(all_labels) if all_labels else None
    layout = getattr(trainer, "layout", None)
    if layout is not None and not layout.writes_outputs:  # a copy of its tensor-parallel group's first rank's
        local_preds = local_labels = None
        count, loss_sum = 0, paddle.zeros_like(loss_sum)
    preds = dist.gather_nested(local_preds, PADDING_INDEX)
    labels = dist.gather_nested(local_labels, PADDING_INDEX) if all_labels else None
    count = int(dist.reduce_scalars([count], op="sum")[0])
    total = dist.all_reduce_sum(loss_sum) if has_loss else None
    preds, labels = to_numpy(preds), to_numpy(labels)
    order = getattr(loader, "eval_order", None)  # a recipe's interleaved shards (trainer.data.InterleavedEvalSampler)
    if order is not None:
        preds, labels = _in_dataset_order(preds, order), _in_dataset_order(labels, order)
    return InferenceOutput(preds, labels, float(total) if total is not None else None, count)


def _in_dataset_order(gathered, order):
    """Outputs gathered in rank order put back in dataset order (``order[i]``: the dataset index of row ``i``)."""
    def restore(array):
        if getattr(array, "shape", None) is None or array.shape[:1] != order.shape:
            return array
        out = np.empty_like(array)
        out[order] = array
        return out
    return _map(restore)(gathered)


class _HostParts:
    """The outputs moved to the host every ``every`` batches (``eval_accumulation_steps``; None: never)."""

    def __init__(self, every: Optional[int]):
        self.every = every
        self.parts: List[tuple] = []  # (predictions, labels or None), numpy, each joined over `every` batches

    def maybe_move(self, preds: list, labels: list):
        if not self.every or len(preds) < self.every:
            return preds, labels
        self.parts.append((to_numpy(join_batches(preds)), to_numpy(join_batches(labels)) if labels else None))
        return [], []

    def join(self, preds: list, labels: list, on_device: bool):
        """Every part and what is left, as single parts for :func:`join_batches`: host tensors on one process,
        device tensors when a gather across ranks follows."""
        if preds:
            self.maybe_move_all(preds, labels)
        place = None if on_device else paddle.CPUPlace()
        as_tensor = _map(lambda a: paddle.to_tensor(a, place=place))
        joined_preds = [join_batches([as_tensor(p) for p, _ in self.parts])]
        joined_labels = [join_batches([as_tensor(lb) for _, lb in self.parts])] if self.parts[0][1] is not None else []
        self.parts = []
        return joined_preds, joined_labels

    def maybe_move_all(self, preds: list, labels: list) -> None:
        every, self.every = self.every, len(preds)
        self.maybe_move(preds, labels)
        self.every = every


def _map(fn):
    def apply(value):
        if isinstance(value, dict):
            return {k: apply(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(apply(v) for v in value)
        return None if value is None else fn(value)
    return apply
def eval_sets(dataset, prefix: str = "eval") -> List[Tuple[str, Any]]:
    """``[(metric prefix, dataset)]``: one dataset keeps ``prefix``; a dict ``{name: dataset}`` (several evaluation
    sets, as Hugging Face's) gives ``prefix_name`` per set, in the dict's order::

        >>> [p for p, _ in eval_sets({"val": [1], "test_b": [2]})]
        ['eval_val', 'eval_test_b']
    """
    if not isinstance(dataset, dict):
        return [(prefix, dataset)]
    if not dataset:
        raise ConfigError("eval_dataset is an empty dict: give {name: dataset, ...} with at least one set, or None")
    for name, value in dataset.items():
        if not isinstance(name, str) or not name.strip() or any(c.isspace() or c in "/%" for c in name):
            raise ConfigError(f"eval_dataset name {name!r} is not allowed: use a word such as 'val' (it becomes the "
                              f"metric prefix {prefix}_<name>_)")
        if value is None:
            raise ConfigError(f"eval_dataset[{name!r}] is None: give a dataset or leave the name out")
    return [(f"{prefix}_{name}", value) for name, value in dataset.items()]


def check_eval_sets(dataset, args) -> None:
    """At construction: the names of several evaluation sets, and a ``metric_for_best_model`` that names one of them
    when it is the loss (``eval_loss`` exists only for a single set)."""
    if not isinstance(dataset, dict):
        return
    sets = eval_sets(dataset)
    if args.metric_for_best_model in ("loss", "eval_loss"):
        names = ", ".join(f"{p}_loss" for p, _ in sets)
        raise ConfigError(f"metric_for_best_model={args.metric_for_best_model!r} but eval_dataset has several sets: "
                          f"name one of {names} (e.g. {option('metric_for_best_model', sets[0][0] + '_loss')})")


def speed_metrics(prefix: str, start: float, samples: int, batch_size: int) -> dict:
    """PaddleNLP's ``{prefix}_runtime``, ``{prefix}_samples_per_second``, ``{prefix}_steps_per_second`` since
    ``start`` (a ``time.time()``); steps as PaddleNLP counts them: ``ceil(samples / global batch)``."""
    runtime = max(time.time() - start, 1e-9)
    steps = math.ceil(samples / max(1, batch_size * dist.get_world_size()))
    return {f"{prefix}_runtime": round(runtime, 4), f"{prefix}_samples_per_second": round(samples / runtime, 4),
            f"{prefix}_steps_per_second": round(steps / runtime, 4)}


def compute_metrics_of(trainer, out: InferenceOutput, prefix: str) -> dict:
    """``{prefix}_loss`` and ``trainer.compute_metrics``' values, each key prefixed once."""
    metrics = {}
    if out.loss_sum is not None:
        metrics[f"{prefix}_loss"] = out.loss_sum / out.count
    if trainer.compute_metrics is not None and out.label_ids is not None:
        metrics.update(flatten_metrics(trainer.compute_metrics(EvalPrediction(out.predictions, out.label_ids)), prefix))
    return metrics


def logits_from_outputs(outputs: Any):
    """The predictions in a model's outputs: a tensor as it is; ``logits`` of a dict or output object (else its
    first non-loss value); of a sequence, the non-scalar tensors (one, or a tuple of them)."""
    if isinstance(outputs, paddle.Tensor):
        return outputs
    if isinstance(outputs, dict):
        return outputs.get("logits", next(v for k, v in outputs.items() if k != "loss"))
    if hasattr(outputs, "logits"):
        return outputs.logits
    if isinstance(outputs, (list, tuple)):
        rest = [o for o in outputs if isinstance(o, paddle.Tensor) and o.size != 1] or list(outputs)
        return rest[0] if len(rest) == 1 else tuple(rest)
    return outputs


def _detach(value):
    if isinstance(value, (list, tuple)):
        return type(value)(_detach(v) for v in value)
    if isinstance(value, dict):
        return {k: _detach(v) for k, v in value.items()}
    return value.detach() if isinstance(value, paddle.Tensor) else value


def join_batches(parts: Sequence[Any], padding_index: float = PADDING_INDEX):
    """Per-batch outputs joined along dim 0: tensors, or tuples/lists/dicts of them (the structure of the first
    part). Every non-batch dimension is padded to the longest among the parts with ``padding_index``."""
    if not parts:
        return None
    first = parts[0]
    if isinstance(first, dict):
        return {k: join_batches([p[k] for p in parts], padding_index) for k in first}
    if isinstance(first, (list, tuple)):
        return type(first)(join_batches([p[i] for p in parts], padding_index) for i in range(len(first)))
    if first is None:
        return None
    parts = [p if p.ndim else p.reshape([1]) for p in parts]  # a scalar per batch: one row each
    longest = [max(int(p.shape[d]) for p in parts) for d in range(1, parts[0].ndim)]
    return paddle.concat([pad_to(p, [int(p.shape[0])] + longest, padding_index) for p in parts], axis=0)

