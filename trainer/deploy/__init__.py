"""Deployment: from a trained model to something that answers.

Owns: exporting an inference model with ``paddle.jit.save`` and proving it
matches the trained one (``export``), and loading an export into a
``paddle.inference`` predictor and running it (``predictor``).

May import: the loop's lower modules (``trainer.errors``, ``trainer.distributed``,
``trainer.tensors``); never the loop, checkpoints, the launcher or the commands.

Used by: ``Trainer.export()``, ``callbacks.Export``, the tasks' ``predict``
(``models.*``) and ``ptrain predict``.
"""
