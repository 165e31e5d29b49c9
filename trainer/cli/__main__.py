"""``python -m trainer.cli ARGS`` = ``ptrain ARGS``."""

import sys

from .commands import main

sys.exit(main())
