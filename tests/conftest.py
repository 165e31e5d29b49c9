"""Makes ``from helpers import ...`` work in test files.

The repository root goes first on sys.path, so ``trainer`` and ``callbacks``
resolve to the packages and never to the ``tests/trainer`` or
``tests/callbacks`` folders; ``tests/`` goes last, for ``helpers``.
"""

import os
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(TESTS))
sys.path.append(TESTS)
