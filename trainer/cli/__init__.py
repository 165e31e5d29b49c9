"""The ``ptrain`` commands and the console.

Owns: the argument parser and its usage text (``parser``), the entry point and
the small commands (``commands``: list, predict, inspect, launch), ``ptrain serve``'s
flags and command (``serve``), a task's run
in this process and the script paddle's launcher runs for it (``run``,
``launch_entry``), the task registry (``tasks``), ``ptrain inspect``'s report
(``describe``), ``ptrain verify-resume`` (``verify_resume``), ``ptrain visualdl``
(``visualdl_serve``), and what the console shows (``console``).

May import: ``trainer.*`` (every other room: this is the top floor) and the public ``callbacks`` package.

Used by: nothing imports this room but the ``ptrain`` entry point (``trainer.cli:main``) and
``python -m trainer.cli``. Tasks (``models.*``) register through entry points and never import it.
"""

from .commands import main

__all__ = ["main"]
