"""Pipeline parallel inside the loop: paddle's 1F1B schedule runs the step's micro-batches; evaluation through the stages.

:func:`trainer.parallel.parallelize` wraps a ``PipelineLayer`` in fleet's ``PipelineParallel`` and hands the loop two
things from here, so the loop never branches on the layout:

- :class:`PipelineSteps`, the step runner (``Parallelized.step_runner``): it reads the step's micro-batches, splits
  each into ``(inputs, labels)`` and gives them to paddle's ``forward_backward_pipeline`` (1F1B with
  ``accumulate_steps`` = the step's micro-batches; every stage's backward, the loss divided by the micro-batches
  as the loop's own accumulation does); the loop's ``_optimizer_step`` then steps fleet's
  HybridParallelOptimizer (clipping by the norm over every stage). The step's loss is the last stage's, kept on
  the device: paddle's schedule would broadcast it to every stage at every step (and read a flag to the host
  on the others), so the runner keeps it where it is, and :meth:`~trainer.layout.Layout.share_loss`
  broadcasts the window's sum over the pipeline group at logging steps only. On the other stages the step loss
  is None (``state.step_loss``: a value no callback can take for a loss); the logged loss is the last stage's on
  every rank.
- :class:`PipelineInference` (``Parallelized.inference_model``): a layer whose forward runs one batch through the
  stages with paddle's ``eval_batch`` and returns the last stage's outputs on every rank of the pipeline group,
  as the evaluation code expects of a model.

Shapes travel with every micro-batch (fleet's ``p2p_cache_shape`` is off, ``trainer.parallel.apply``): the receiving
stage reads them to the host (paddle's ``recv_meta``), the one host read of a step outside logging steps, the price
of batches whose shapes change (evaluation's, an epoch's last). A step's micro-batches must share one shape.

The loss scaler (AMP fp16) is handed to paddle's schedule, which scales each micro-batch's loss before its
backward; the loop's ``backward_begin`` / ``backward_end`` events do not fire under pipeline parallel (the
backward passes are paddle's, interleaved with other micro-batches' forwards).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, List, Optional

import paddle

from ..data.batch import labels_of
from ..errors import ConfigError, DataError, option


def require_pipeline_model(model, degree: int) -> None:
    """A ConfigError naming the field when the model cannot be cut into stages (not a ``PipelineLayer``)."""
    from paddle.distributed.fleet.meta_parallel import PipelineLayer

    if not isinstance(model, PipelineLayer):
        raise ConfigError(f"pipeline_parallel_degree={degree} needs a paddle PipelineLayer model (LayerDesc per layer, "
                          f"a loss_fn), got {type(model).__name__}: build one (docs/how-to/large-models.md) or set "
                          f"{option('pipeline_parallel_degree', 1)}")
    if model._loss_fn[0] is None:  # paddle keeps PipelineLayer(loss_fn=...) there (no public getter)
        raise ConfigError("the PipelineLayer has no loss_fn: build it with PipelineLayer(..., loss_fn=...) (the last "
                          "stage computes the loss)")


def split_batch(batch: Any, label_names: Optional[List[str]]):
    """A micro-batch -> ``(inputs, labels)`` as paddle's schedule takes it: the first stage gets ``inputs`` (the
    batch's dict without its labels, a sequence's inputs), the last stage ``labels``.

    >>> split_batch({"input_ids": 1, "labels": 0}, None), split_batch((1, 2, 3), None)
    (({'input_ids': 1}, 0), ((1, 2), 3))
    """
    if isinstance(batch, Mapping):
        keys = label_names or ["labels"]
        return {k: v for k, v in batch.items() if k not in keys}, labels_of(batch, keys)
    if isinstance(batch, (list, tuple)):
        if len(batch) == 1:
            return batch[0], None
        return (batch[0] if len(batch) == 2 else tuple(batch[:-1])), batch[-1]
    return batch, None


class PipelineSteps:
    """The step runner under pipeline parallel: ``runner(trainer, next_batch) -> step loss`` (a device tensor on the
    last stage, None on the others)."""

    def __init__(self, pipeline):
        self.pipeline = pipeline  # fleet's PipelineParallel
        # the one override of paddle's schedule: keep the loss on the last stage (no per-step broadcast, no host read)
        pipeline._broadcast_final_loss = self._last_stage_loss

    def __call__(self, trainer, next_batch: Callable[[], Any]) -> Optional[paddle.Tensor]:
        n = trainer.state.num_micro_batches
        names = trainer.args.label_names
        micro = [split_batch(next_batch(), names) for _ in range(n)]  # every rank reads the step's batches
        _check_one_shape(micro)
        trainer.state.micro_step = n - 1
        self.pipeline.accumulate_steps = n  # the epoch's last step may hold fewer micro-batches
        scaler = trainer.grad_scaler if hasattr(trainer.grad_scaler, "scale") else None
        with trainer.callbacks.forward_context(trainer):
            return self.pipeline.forward_backward_pipeline(iter(micro), scaler=scaler)

    def _last_stage_loss(self, return_micro_batch_loss: bool = False) -> Optional[paddle.Tensor]:
        pipeline = self.pipeline
        if not pipeline.is_pipeline_last_stage(ignore_virtual=True):
            return None  # the loss is the last stage's: Layout.share_loss hands it to the others at logging steps
        parts = [t.astype("float32").reshape([]) for t in pipeline.total_loss[0]]  # each already divided by n
        return paddle.add_n(parts) if len(parts) > 1 else parts[0]


def _shapes(value) -> list:
    if isinstance(value, Mapping):
        return [(k, _shapes(v)) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [_shapes(v) for v in value]
    return list(value.shape) if hasattr(value, "shape") else None


def _check_one_shape(micro: list) -> None:
    """The micro-batches of one step must have one shape: paddle's schedule receives each micro-batch's gradient into
    the shape of the activation a stage sent last (shapes are read on the host, no device sync)."""
    first = _shapes(micro[0])
    for i, batch in enumerate(micro[1:], 1):
        if _shapes(batch) != first:
            raise DataError(f"pipeline parallel: micro-batch {i} of the step has shapes {_shapes(batch)}, micro-batch 0 "
                            f"{first}: every micro-batch of a step needs one shape (pad to a fixed length in the "
                            f"collate_fn, and keep {option('dataloader_drop_last', True)})")


class PipelineInference(paddle.nn.Layer):
    """One batch through every stage (paddle's ``eval_batch``); the last stage's outputs on every rank."""

    def __init__(self, pipeline, hcg):
        super().__init__()
        self.pipeline = pipeline
        self._last = hcg.get_rank_from_stage(hcg.get_pipe_parallel_world_size() - 1)
        self._group = hcg.get_pipe_parallel_group()

    def forward(self, *args, **kwargs):
        inputs = kwargs if kwargs else (args[0] if len(args) == 1 else tuple(args))
        pipeline = self.pipeline
        steps, pipeline.accumulate_steps = pipeline.accumulate_steps, 1
        try:
            outputs = pipeline.eval_batch(iter([(inputs, None)]), compute_loss=False)
        finally:
            pipeline.accumulate_steps = steps
        last = pipeline.is_pipeline_last_stage(ignore_virtual=True)
        return _broadcast_outputs(outputs[0] if last else None, self._last, self._group)


def _broadcast_outputs(value, src: int, group):
    """The last stage's outputs (a tensor or a tuple of them) on every rank of ``group``: their shapes and dtypes
    first (one small object), then the tensors."""
    import paddle.distributed as pdist

    meta = [None]
    if value is not None:
        parts = value if isinstance(value, (list, tuple)) else (value,)
        meta = [(isinstance(value, (list, tuple)), [(list(t.shape), str(t.dtype).replace("paddle.", "")) for t in parts])]
    pdist.broadcast_object_list(meta, src=src, group=group)
    is_tuple, specs = meta[0]
    if value is None:
        parts = tuple(paddle.empty(shape, dtype=dtype) for shape, dtype in specs)
    for t in parts:
        pdist.broadcast(t, src=src, group=group)
    return tuple(parts) if is_tuple else parts[0]
