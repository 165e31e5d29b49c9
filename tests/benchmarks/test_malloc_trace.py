"""``benchmarks/malloc_trace.c`` under ``LD_PRELOAD`` counts a real process's mallocs and frees by size class and
event: a block kept past its event is counted alive, one freed in the next event is counted freed there."""

import os
import shutil
import subprocess
import sys

import pytest

from benchmarks import malloc_trace

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")

PROGRAM = """
import ctypes
libc = ctypes.CDLL(None)  # the process's malloc: the preloaded one (libc.so.6's own handle would bypass it)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
mark = ctypes.CDLL(None).malloc_trace_mark
mark.argtypes = [ctypes.c_char_p]
mark(b"start")
kept = libc.malloc(3_000_000)
libc.free(libc.malloc(5_000))
mark(b"one")
libc.free(kept)
mark(b"two")
"""


def test_blocks_by_size_and_event(tmp_path):
    env = dict(os.environ, **malloc_trace.preload(str(tmp_path), "run"))
    env.pop("PADDLE_TRAINER_ID", None)
    subprocess.run([sys.executable, "-c", PROGRAM], env=env, check=True, timeout=120)
    ((start, one, two),) = malloc_trace.load(str(tmp_path), "run")
    assert [e["event"] for e in (start, one, two)] == ["start", "one", "two"]
    big, small = (3_000_000).bit_length(), (5_000).bit_length()
    assert one["allocs"][big] >= 1 and one["born_alive"][big] >= 1 and one["born_alive_bytes"][big] >= 3_000_000
    assert one["allocs"][small] >= 1 and one["freed"][small] >= 1
    assert two["freed"][big] >= 1 and two["live_bytes"] <= one["live_bytes"] - 3_000_000
    assert one["peak_live_bytes"] >= one["live_bytes"]
    text = malloc_trace.side_by_side(str(tmp_path), "run", "run")
    assert "rank 0" in text and "one" in text
