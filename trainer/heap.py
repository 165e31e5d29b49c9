"""The cyclic garbage collector during training: what is alive when the loop starts is left out.

A full (generation-2) collection walks every object the interpreter tracks, and a process with
paddle, the model, the data and the loggers imported holds ~150,000 of them: each full collection
of the training loop took ~50 ms here, one every ~1,500 steps of a small model, ~0.03 ms a step.
Nearly all those objects live as long as the process (modules, classes, the model, the dataset),
so :func:`frozen_heap` moves them to the permanent generation with :func:`gc.freeze` for the
length of the loop (what the Python docs advise for long-running processes) and back at its end.
Collections still run, over the objects made since; a cycle among the frozen objects that
becomes garbage during the loop is freed after it. A program that froze objects itself keeps
its own arrangement (nothing is frozen or unfrozen here then). It also spares forked DataLoader
workers the copy-on-write of pages the collector would have touched.

:func:`start_waiting_thread` starts the threads that exist only to wait with a small stack.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[bool]:
    """Freeze the tracked objects for the block (yields whether it did)."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield False
        return
    gc.freeze()
    try:
        yield True
    finally:
        gc.unfreeze()


#: the stack of a thread that exists to wait (a watchdog, a lease renewal, a signal pipe, a deadline): their deepest
#: path (logging a warning, formatting a stack dump) needs well under this; the 8 MiB default (``ulimit -s``) is
#: reserved address space per thread, which counts against a ``prlimit --as``/``ulimit -v`` limit (issue 41)
WAITING_STACK = 512 * 1024
_STACK_SIZE = threading.Lock()


def start_waiting_thread(thread: threading.Thread) -> threading.Thread:
    """Start ``thread`` with a :data:`WAITING_STACK` stack (``threading.stack_size`` is process-wide: it is set
    for this start only and put back)."""
    with _STACK_SIZE:
        old = threading.stack_size(WAITING_STACK)
        try:
            thread.start()
        finally:
            threading.stack_size(old)
    return thread
