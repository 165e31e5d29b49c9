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

:func:`start_waiting_thread` starts the threads that exist only to wait (the stall watchdog, the lease
renewal, the signal pipe's reader, the preemption deadline) so that they cost next to no address space. Each
Python thread mallocs as it starts, and glibc gives a thread that mallocs its own arena: 64 MiB of reserved address
space (``HEAP_MAX_SIZE``), plus an 8 MiB stack. Measured beside PaddleNLP's Trainer (issue 41), these threads put
ours 130-180 MiB of address space above it per rank, and one layer lower under a ``prlimit --as`` limit.
So before the first of them starts, :func:`share_arenas` caps glibc's arenas at the number the process already
has (``mallopt(M_ARENA_MAX)``): the waiting threads then share those arenas (they malloc a few times a minute),
and the threads paddle already runs keep theirs. A process whose environment sets ``MALLOC_ARENA_MAX`` (or
glibc's ``arena_max`` tunable) keeps that; non-glibc platforms are left as they are.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import re
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


M_ARENA_MAX = -8  # glibc's mallopt parameter
_ARENAS_SHARED: list = []


def _libc():
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_info, libc.mallopt, libc.open_memstream  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return None
    return libc


def malloc_arenas() -> int:
    """How many malloc arenas this process has now (glibc's ``malloc_info``; 0 elsewhere)."""
    libc = _libc()
    if libc is None:
        return 0
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    libc.open_memstream.restype = ctypes.c_void_p
    libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.free.argtypes = [ctypes.c_void_p]
    stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not stream:
        return 0
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    text = ctypes.string_at(buf, size.value).decode("ascii", "replace")
    libc.free(ctypes.cast(buf, ctypes.c_void_p))
    return len(re.findall(r'<heap nr="\d+">', text))


def share_arenas() -> int:
    """Cap glibc's arenas at the number this process has now (once; see the module docstring). Returns the cap,
    0 when left alone (the environment chose, or no glibc)."""
    if _ARENAS_SHARED:
        return _ARENAS_SHARED[0]
    cap = 0
    chosen = "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", "")
    libc = None if chosen else _libc()
    if libc is not None:
        cap = max(1, malloc_arenas())
        if not libc.mallopt(M_ARENA_MAX, cap):
            cap = 0
    _ARENAS_SHARED.append(cap)
    return cap


def start_waiting_thread(thread: threading.Thread) -> threading.Thread:
    """Start ``thread`` with a :data:`WAITING_STACK` stack (``threading.stack_size`` is process-wide: it is set
    for this start only and put back), sharing the malloc arenas the process has (:func:`share_arenas`)."""
    share_arenas()
    with _STACK_SIZE:
        old = threading.stack_size(WAITING_STACK)
        try:
            thread.start()
        finally:
            threading.stack_size(old)
    return thread
