"""An out-of-memory that never ends a job: ``auto_find_batch_size``.

A step that runs out of memory (paddle raises ``MemoryError``: its ``ResourceExhausted`` error on the CPU
allocator and its ``BadAlloc`` on a GPU's, both translated to Python's ``MemoryError``) is run again with the
micro-batch halved, on every rank, and the run goes on. What is trained does not change:

- The sampler, the dataloader and the checkpoint's sampler position never change: each rank still draws
  ``per_device_train_batch_size`` samples per data batch and ``gradient_accumulation_steps`` data batches per
  step. A data batch is cut into pieces of ``state.train_micro_batch_size`` samples inside the step
  (:func:`split_batch`), so the micro-batch halves and the accumulation doubles while the global batch, the
  samples of every step, the LR schedule and ``samples_seen`` stay exactly what they were. Each piece's loss is
  weighted by its share of the data batch, so the gradient is the data batch's mean (equal up to float
  rounding; a model with BatchNorm sees smaller batches' statistics, as anywhere micro-batching is used).
- The size is on :class:`trainer.TrainerState` (``train_micro_batch_size``), so it travels in every
  checkpoint and a resume starts at the size that fitted.
- At a micro-batch of 1 that still does not fit, :class:`trainer.errors.OutOfMemory` (exit code 8).

Every rank agrees, and no rank can deadlock. Under DataParallel the gradient all-reduce runs inside the last
micro-batch's backward: a rank that fails in its forward while another waits in that all-reduce would hang
both. So with ``auto_find_batch_size`` the layout defers it (``trainer.parallel.grad_sync``: every
micro-batch's backward under ``no_sync``); after the last one each rank says whether it failed
(:meth:`AutoBatch.ranks_failed`: one all-reduce of a one-element host tensor over a gloo group, host to host,
so no device-to-host sync enters the step), and only when no rank failed are the gradients all-reduced
(:meth:`~trainer.parallel.grad_sync.GradSync.finish`: paddle's ``fused_allreduce_gradients``, the same average
DataParallel computes). The price, on more than one process only: gradient communication no longer overlaps
the last backward. An out-of-memory in the optimizer update itself is not retried (the update is not
repeatable and its memory does not depend on the batch).

    >>> [(piece[0].tolist(), piece[1].tolist(), share) for piece, share in split_batch((np.arange(5), np.arange(5) * 10), 2)]
    [([0, 1], [0, 10], 0.4), ([2, 3], [20, 30], 0.4), ([4], [40], 0.2)]
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Mapping
from typing import Any, List, Optional, Tuple

import numpy as np
import paddle

from . import distributed as dist
from .data.batch import batch_size
from .errors import ConfigError, OutOfMemory, option

logger = logging.getLogger("trainer")


def is_out_of_memory(error: BaseException) -> bool:
    """Paddle's out-of-memory error, on CPU and GPU (both arrive as ``MemoryError``)."""
    return isinstance(error, MemoryError)


def release_memory() -> None:
    """Give back what a failed attempt held once its references are dropped: Python's cycles, then (the GPU
    seam) the blocks paddle's CUDA allocator caches."""
    gc.collect()
    if paddle.is_compiled_with_cuda() and "gpu" in str(paddle.get_device()):  # pragma: no cover - needs a GPU
        paddle.device.cuda.empty_cache()


def split_batch(batch: Any, size: int) -> List[Tuple[Any, float]]:
    """``batch`` cut along dim 0 into pieces of ``size`` samples (the last may be smaller), each with its share
    of the batch (``len(piece) / len(batch)``: the weight of its mean loss in the batch's mean). Tensors, numpy
    arrays and per-sample lists are cut; tuples, lists and dicts of them keep their structure; anything else
    (a scalar) goes to every piece."""
    n = batch_size(batch)
    if size <= 0 or n <= size:
        return [(batch, 1.0)]
    return [(_take(batch, start, min(start + size, n), n), (min(start + size, n) - start) / n)
            for start in range(0, n, size)]


def _take(value: Any, start: int, stop: int, n: int) -> Any:
    if isinstance(value, Mapping):
        parts = {k: _take(v, start, stop, n) for k, v in value.items()}
        try:
            return type(value)(parts)  # dict, paddlenlp's BatchEncoding
        except TypeError:
            return parts
    if isinstance(value, tuple):
        return tuple(_take(v, start, stop, n) for v in value)
    if isinstance(value, (paddle.Tensor, np.ndarray)) and value.ndim and value.shape[0] == n:
        return value[start:stop]
    if isinstance(value, list):
        if len(value) == n and not any(isinstance(v, (paddle.Tensor, np.ndarray, list, tuple, Mapping)) for v in value):
            return value[start:stop]  # one entry per sample (texts, ids)
        return [_take(v, start, stop, n) for v in value]
    return value


class AutoBatch:
    """The retry policy of one ``fit()``: when to cut batches, how to agree, how to shrink.

    Args:
        world_size: processes of the job; above 1 the ranks agree after every step's backward.
        per_device_batch: the data batch each rank draws (``per_device_train_batch_size``).
        layout: the job's :class:`trainer.layout.Layout`. Sharding stage 1 reduces gradients inside the
            optimizer step, after the agreement: nothing to defer. Stages 2 and 3 reduce them inside backward
            hooks that no ``no_sync`` stops: refused on more than one process (:class:`ConfigError`). Pipeline
            parallel (paddle's schedule runs the micro-batches through the stages): refused.
    """

    def __init__(self, world_size: int, per_device_batch: int, layout=None):
        self.world_size = world_size
        self.per_device_batch = per_device_batch
        self._group = None
        if world_size > 1 and layout is not None and layout.shards_gradients:
            raise ConfigError(f"{option('auto_find_batch_size', True)} with sharding stage "
                              f"{layout.sharding_stage} on {world_size} processes: its gradient reduce runs inside "
                              "backward, where one rank's out-of-memory would hang the others; use sharding stage1 "
                              f"or data parallel with it, or set {option('auto_find_batch_size', False)}")
        if layout is not None and layout.pp_degree > 1:
            raise ConfigError(f"{option('auto_find_batch_size', True)} with pipeline_parallel_degree="
                              f"{layout.pp_degree}: paddle's pipeline schedule runs the step's micro-batches through "
                              "every stage, where one stage's out-of-memory would leave the others waiting for its "
                              f"activations; set {option('auto_find_batch_size', False)} and lower "
                              "per_device_train_batch_size (raise gradient_accumulation_steps to keep the global batch)")

    def ranks_failed(self, failed: bool) -> int:
        """Every rank calls this once per step attempt: how many ranks ran out of memory (the same number on
        all of them). A host tensor over a gloo group: no device work, no device-to-host sync."""
        if self.world_size == 1:
            return int(failed)
        if self._group is None:
            # a CPU build's default group is gloo already; a GPU build's is NCCL, which takes no host tensor
            self._group = None if not paddle.is_compiled_with_cuda() else paddle.distributed.new_group(backend="gloo")
        flag = paddle.to_tensor(np.array([1 if failed else 0], dtype="int32"), place=paddle.CPUPlace())
        paddle.distributed.all_reduce(flag, op=paddle.distributed.ReduceOp.SUM, group=self._group)
        return int(flag.numpy()[0])

    def shrink(self, current: int, step: int, error: Optional[BaseException], failed: int = 1) -> int:
        """The next micro-batch after an out-of-memory at ``current`` samples (half, at least 1); raises
        :class:`OutOfMemory` when ``current`` is 1 already. Logs one line."""
        if current <= 1:
            where = f"this rank: {str(error).strip().splitlines()[0]}" if error is not None else "another rank"
            raise OutOfMemory(f"out of memory at step {step + 1} with a micro-batch of 1 sample ({where}): the model "
                              "does not fit in this memory even so; use sharding or recompute, a smaller model or "
                              "more memory per process") from error
        smaller = max(1, current // 2)
        pieces = -(-self.per_device_batch // smaller)
        if dist.is_main_process():
            logger.warning("out of memory at step %d on %d of %d processes: micro-batch %d -> %d samples per "
                           "process, %d pieces per data batch of %d; the global batch and the samples of every step "
                           "are unchanged", step + 1, failed, self.world_size, current, smaller, pieces,
                           self.per_device_batch)
        return smaller

    def accumulate(self, trainer, batches):
        """Forward and backward of one optimizer step's micro-batches, cut to ``state.train_micro_batch_size``
        and run again smaller after an out-of-memory on any rank; returns the step's mean loss (on the
        device). The step's data batches are drawn once and held, so a retry trains on the very same
        samples and the sampler never moves back."""
        state = trainer.state
        n = state.num_micro_batches
        sync = trainer._grad_sync  # deferred under DataParallel: nothing is all-reduced before the ranks agree
        data = [trainer._next_batch(batches) for _ in range(n)]
        while True:
            size = state.train_micro_batch_size or self.per_device_batch
            step_loss, error = None, None
            try:
                for i, batch in enumerate(data):
                    state.micro_step = i
                    pieces = split_batch(batch, size)
                    for j, (piece, share) in enumerate(pieces):
                        trainer.loss_share = share
                        with sync.context(last=i == n - 1 and j == len(pieces) - 1):
                            loss = trainer.training_step(trainer.model_wrapped, piece)
                        part = loss * (share / n) if share != 1.0 or n > 1 else loss
                        step_loss = part if step_loss is None else step_loss + part
            except MemoryError as exc:
                error = exc.with_traceback(None)  # its frames would keep the failed attempt's tensors alive
            finally:
                trainer.loss_share = 1.0
            failed = self.ranks_failed(error is not None)
            if not failed:
                sync.finish()  # the gradients' average over the ranks, now that every rank's backward succeeded
                return step_loss
            step_loss = loss = part = piece = pieces = None  # drop the attempt's tensors
            state.loss = None
            trainer.optimizer.clear_grad(set_to_zero=False)  # frees the gradients, not just zeroes them
            release_memory()
            state.train_micro_batch_size = self.shrink(size, state.global_step, error, failed)
