"""The parallel room: how the model is laid out over ranks, decided and applied in one place.

Owns: the :class:`Layout` (degrees, sharding stage, offload, recompute, and the groups that
answer "which group reduces this?"), and :func:`parallelize`, which ``Trainer.fit`` calls once
after ``on_fit_begin`` to apply the layout in a fixed order: recompute, then sharding or data
parallel (fleet's hybrid topology for tensor and pipeline parallel and sharding stage 1, paddle's
``group_sharded_parallel`` for stages 2 and 3, ``paddle.DataParallel`` otherwise), and ``grad_sync.GradSync``, which
the loop and ``trainer.auto_batch`` ask when DataParallel averages the gradients (in the step's last backward, or
deferred to one fused all-reduce after it). The hybrid topology
(``apply.init_topology``) is set up before a tensor- or pipeline-parallel model is built: by
``TrainingArguments`` when a degree is above 1, as PaddleNLP does.

May import: paddle, ``trainer.errors``, ``trainer.ranks``, ``trainer.distributed``, ``trainer.tensors``,
``trainer.checkpoint.slices`` (``merge``, ``apply``: which parameters fleet split). Never the trainer loop, callbacks or
models.

Used by: ``trainer.trainer`` (``trainer.layout``, ``parallelize``), ``trainer.args`` (the
fields are checked together by :meth:`Layout.plan`), callbacks, metrics and checkpoints, which
read ``trainer.layout`` and never branch on the parallel mode.

Importing the package costs no paddle import (``trainer.args`` checks the fields through
:class:`Layout`, and ``ptrain inspect`` reads it without paddle): ``layout`` is plain Python;
``apply`` and ``recompute`` import paddle and are imported by name where used.
"""

from .layout import Layout, parse_sharding  # noqa: F401
