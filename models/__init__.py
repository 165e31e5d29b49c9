"""Reference tasks built on ``trainer`` and ``callbacks``.

Each sub-package exposes ``TASK`` (a :class:`trainer.task.Task`) and is
registered under the ``ptrain.tasks`` entry-point group in setup.cfg;
``ptrain list`` shows them.
"""
