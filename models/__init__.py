"""Reference tasks built on ``trainer`` and ``callbacks``.

Each sub-package exposes ``TASK`` (a :class:`trainer.task.Task`) and is
registered under the ``ptrain.tasks`` entry-point group in setup.cfg;
``ptrain list`` shows them.

May import: ``trainer`` (its public face: ``Trainer``, ``TrainingArguments``), ``trainer.task`` (the interface
a task implements), ``trainer.data``, ``trainer.deploy`` (a task's predictor), ``trainer.distributed``,
``trainer.tensors``, ``trainer.errors`` and ``callbacks``; never the commands (``ptrain`` finds the tasks
through entry points).
"""
