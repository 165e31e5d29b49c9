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


# PTRAIN_TEST_CPU=FILE: one JSON line per test with its wall time and the CPU seconds of the test's
# process and the children it waited for (the suite's cost on a core, whatever the machine's load)
if os.environ.get("PTRAIN_TEST_CPU"):
    import json
    import resource
    import time

    import pytest

    def _cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        cpu, wall = _cpu(), time.monotonic()
        yield
        with open(os.environ["PTRAIN_TEST_CPU"], "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": item.nodeid, "cpu": round(_cpu() - cpu, 2),
                                "wall": round(time.monotonic() - wall, 2)}) + "\n")
