"""The script ``paddle.distributed.launch`` runs on every process for ``ptrain run``.

The launcher runs a file, not a module; Python then puts this file's folder
first on ``sys.path``, where ``trainer.py`` would shadow the package. Drop it.
"""

import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    from trainer.cli import main

    sys.exit(main())
