"""The scheduling hint in tests/conftest.py stays true: every file it starts first exists."""

import os
import sys

from helpers import REPO


def test_the_longest_files_listed_first_exist():
    path = os.path.join(REPO, "tests", "conftest.py")  # loaded by pytest, under a name its import mode chose
    conftest = next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == path)
    assert len(conftest.LONGEST_FIRST) >= 10
    missing = [path for path in conftest.LONGEST_FIRST if not os.path.isfile(os.path.join(REPO, path))]
    assert not missing, f"tests/conftest.py LONGEST_FIRST names files that are gone: {missing}"
