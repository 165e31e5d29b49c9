"""The parallel room: the model laid out over ranks, applied in one place.

Owns: :func:`parallelize` (``apply``), which ``Trainer.fit`` calls once after ``on_fit_begin`` to apply the run's
:class:`trainer.layout.Layout` in a fixed order: recompute (``recompute``), then sharding or data parallel (fleet's
hybrid topology for tensor and pipeline parallel and sharding stage 1, paddle's ``group_sharded_parallel`` for
stages 2 and 3, ``paddle.DataParallel`` otherwise), the pipeline schedule's runner (``pipeline``), and
``grad_sync.GradSync``, which the loop and ``trainer.auto_batch`` ask when DataParallel averages the gradients (in
the step's last backward, or deferred to one fused all-reduce after it). The hybrid topology
(``apply.init_topology``) is set up before a tensor- or pipeline-parallel model is built: by ``TrainingArguments``
when a degree is above 1, as PaddleNLP does.

May import: paddle, ``trainer.errors``, ``trainer.distributed``, ``trainer.layout`` (the Layout it applies, which
parameters fleet split), ``trainer.data`` (``data.batch``: a batch's size and labels). Never the trainer loop, checkpoints, callbacks or models.

Used by: ``trainer.trainer`` (``parallelize``) and ``trainer.args`` (``init_topology``, before a tensor- or
pipeline-parallel model is built); callbacks, metrics and checkpoints read ``trainer.layout`` and never branch
on the parallel mode.

Importing the package imports nothing: ``apply``, ``recompute``, ``pipeline`` and ``grad_sync`` import paddle and
are imported by name where used.
"""
