"""When a step's gradients are averaged over the data-parallel ranks under ``paddle.DataParallel``.

Two ways, one per step (``gradient_accumulation_steps`` micro-batches, one average):

- **in the last backward** (the default): every micro-batch but the step's last runs under ``no_sync``; the last
  one's backward fires DataParallel's reducer hooks, which all-reduce gradient buckets while the backward goes on
  (communication overlaps computation).
- **deferred**: every backward runs under ``no_sync`` and, after the last one, :meth:`GradSync.finish` averages all
  the gradients in one fused all-reduce (paddle's ``fused_allreduce_gradients``: the same mean as the reducer's,
  coalesced into 128 MiB buffers), as PaddleNLP's Trainer does under recompute. Two layouts need it:

  * ``recompute=True`` on a model that recomputes through its own switch (a PaddleNLP model,
    ``trainer.parallel.recompute.switches_own_recompute``): PaddleNLP's ERNIE uses paddle's reentrant
    ``recompute`` (a ``PyLayer`` whose backward runs a second backward inside the first). The reducer's hooks
    then see a parameter become ready twice in one step and paddle stops the run ("parameter[..] has been ready
    before. Please set find_unused_parameters=True"), with or without ``find_unused_parameters``. Without the
    reducer nothing is counted; one all-reduce after the step's backwards gives the same average whether the
    model's recompute reenters or not (PaddleNLP's Trainer does the same under recompute). The blocks the
    trainer wraps itself (any other model, or ``recompute_modules``) recompute without reentering: the reducer
    follows them, so they keep the overlap.
  * ``auto_find_batch_size`` on several processes (``trainer.auto_batch``): a rank that runs out of memory in a
    forward while the others wait in the last backward's all-reduce would hang them all, so the ranks first agree
    that every backward succeeded, then all-reduce.

  The price: the all-reduce no longer overlaps the last backward. Nothing here copies a tensor to the host.

Layouts without ``paddle.DataParallel`` (one process, fleet's hybrid wrappers, ``group_sharded_parallel``) reduce
their gradients elsewhere (inside the optimizer step or sharding's own hooks): both ways are no-ops for them.
"""

from __future__ import annotations

import contextlib

import paddle
from paddle.distributed.fleet.utils import hybrid_parallel_util


class GradSync:
    """The data-parallel gradient average of one ``fit()``: ``context(last)`` around each micro-batch's forward
    and backward, ``finish()`` once after the step's last backward.

    Args:
        model: the model the loop runs (``Parallelized.model``).
        deferred: all-reduce after the step's backwards instead of inside the last one (see the module docstring);
            ignored unless ``model`` is a ``paddle.DataParallel``.
    """

    def __init__(self, model: paddle.nn.Layer, deferred: bool = False):
        self.model = model
        self.data_parallel = isinstance(model, paddle.DataParallel)
        self.deferred = deferred and self.data_parallel

    def context(self, last: bool):
        """``no_sync`` unless this is the step's last micro-batch and the reducer averages in its backward."""
        if self.data_parallel and (self.deferred or not last):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def finish(self) -> None:
        """After the step's last backward: the deferred average (a no-op otherwise)."""
        if self.deferred:
            hybrid_parallel_util.fused_allreduce_gradients(list(self.model.parameters()), None)  # None: DataParallel's (default) group
