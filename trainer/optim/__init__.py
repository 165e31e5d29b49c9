"""The optim room: what turns gradients into an update, the optimizer and its learning rate.

Owns: building the optimizer ``args.optim`` names, with its weight-decay groups and the clip it is built
with (``optimizer``: ``build_optimizer``, and ``peak_lr``, the learning rate after the linear scaling
rule), the learning-rate schedules counted in optimizer steps (``schedules``: warmup, then decay, a closed
form of the step count), and clipping by the global L2 norm across gradient dtypes, where the run's layout says
the clip runs: in the optimizer's step or in the loop before it (``clipping``).

May import: paddle, ``trainer.errors``. Never the loop, the layout room (the caller hands on the run's Layout,
whose ``clips_in_optimizer`` is the one question asked), checkpoints, callbacks or models.

Used by: ``trainer.trainer`` (``create_optimizer``, the loop's clip), ``trainer.recipe`` (the schedule, the clip),
and the LR warmup and spike-recovery callbacks (``schedules``).
"""
