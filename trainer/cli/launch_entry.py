"""The script ``paddle.distributed.launch`` runs on every process for ``ptrain run``.

The launcher runs a file, not a module; Python then puts this file's folder
first on ``sys.path``, where its modules would shadow others (``parser``, ``run``). Drop it.

Before anything else the worker asks to die with the launcher (SIGTERM when
the launcher dies, even by SIGKILL: the worker then saves and exits 143) and
makes SIGTERM/SIGINT during start-up exit at once (``trainer.process``). It ends with ``os._exit``
once ``main()`` has returned (see the end of this file: paddle's slow C++ teardown was where a rank
stopped by the launcher crashed with SIGSEGV).
"""

import os
import sys

if __name__ == "__main__":
    _launcher = os.getppid()  # read first: the parent-death request must not miss a launcher already gone
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    import signal

    from trainer import process

    process.die_with_parent(signal.SIGTERM, _launcher)
    process.install_startup_handlers()
    from trainer.cli import main

    try:
        code = main()
    except SystemExit as exc:  # a stop signal before training, argparse, ...
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    # Leave without the interpreter's teardown: every file of the run is closed by now (checkpoint writer
    # joined, loggers closed in on_fit_end, results.json written), and paddle's C++ teardown of a distributed
    # process takes seconds (measured: 4-5 s with no Python frame). Paddle's launcher stops the other ranks as
    # soon as one exits with a non-zero code (a preempted 130 / 143), so a rank still in that teardown got
    # SIGTERM there and crashed with SIGSEGV (the launcher then reported -11). Exiting here takes milliseconds.
    import logging

    logging.shutdown()
    process.exit_now(code)
