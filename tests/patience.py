"""How long a test may wait, on a machine that may be busy.

A time limit in a test exists to catch a hang, not to judge speed: on a laptop with a build running (a load
of 20 on 2 cores) every process gets a tenth of a core and a 120 s wait that never trips on an idle machine
trips there. :func:`patience` stretches a limit by the machine's load per core at the moment it is asked (at
least 1, at most :data:`MAX_FACTOR`), so a slow machine gets more time and a real hang is still caught.
Speed itself is never asserted in the suite: figures belong in ``benchmarks/``.

Paddle-free (conftest imports it before any test).
"""

from __future__ import annotations

import os

#: the most a limit is stretched: a hang is still caught within 10x its idle-machine bound
MAX_FACTOR = 10.0


def load_factor() -> float:
    """The 1-minute load average per core, between 1 and :data:`MAX_FACTOR`.

    The suite's own workers count in it (4 xdist workers on 2 cores: about 2), which is right: they too
    compete with the process under test.
    """
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform
        return 1.0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(MAX_FACTOR, max(1.0, load / max(1, cores)))


def patience(seconds: float) -> float:
    """``seconds`` stretched by :func:`load_factor`: use it for every wait that guards against a hang."""
    return seconds * load_factor()
