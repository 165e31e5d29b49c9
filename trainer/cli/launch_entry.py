"""The script ``paddle.distributed.launch`` runs on every process for ``ptrain run``.

The launcher runs a file, not a module; Python then puts this file's folder
first on ``sys.path``, where its modules would shadow others (``parser``, ``run``). Drop it.

Before anything else the worker asks to die with the launcher (SIGTERM when
the launcher dies, even by SIGKILL: the worker then saves and exits 143) and
makes SIGTERM/SIGINT during start-up exit at once (``trainer.process``).
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

    sys.exit(main())
