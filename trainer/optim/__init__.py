"""The optim room: what turns gradients into an update, the optimizer and its learning rate.

Owns: building the optimizer ``args.optim`` names, with its weight-decay groups and the clip it is built
with (``optimizer``: ``build_optimizer``, and ``peak_lr``, the learning rate after the linear scaling
rule), the learning-rate schedules counted in optimizer steps (``schedules``: warmup, then decay, a closed
form of the step count), and clipping by the global L2 norm across gradient dtypes (``clipping``).

May import: paddle, ``trainer.errors``. Never the loop, the layout (``trainer.parallel``: the caller
hands on the clip a layout asks for), checkpoints, callbacks or models.

Used by: ``trainer.trainer`` (``create_optimizer``), ``trainer.recipe`` (the schedule, the clip),
``trainer.parallel.apply`` (the loop's clip), and the LR warmup and spike-recovery callbacks (``schedules``).
"""
