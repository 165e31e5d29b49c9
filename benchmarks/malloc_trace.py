"""Host allocations by size and by step event, two runs side by side: ``benchmarks/malloc_trace.c`` under
``LD_PRELOAD`` (``python -m benchmarks memory --against-paddlenlp --malloc-trace DIR``, or :func:`preload` for any
command whose program calls ``malloc_trace_mark``, as ``benchmarks/llama_script.py`` does at each step event).

:func:`preload` compiles the tracer once into DIR (``cc``, glibc) and gives the environment of one traced run;
:func:`side_by_side` reads two runs' files (one per rank) and prints, per rank and
event, the live bytes and their peak within the event, the main heap's top (``brk``) and its peak, glibc's free
bytes and chunks (``mallinfo2``), the allocations made, the blocks born in the event that outlive it (small: under
2 KiB; large) and the allocations of other threads. Run-to-run differences of the heap's top with the same live
bytes are layout (which free chunk each allocation lands in), not more memory in use.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "malloc_trace.c")
MIB = 2**20
SMALL = 12  # size classes under 2 KiB (class k holds sizes in [2^(k-1), 2^k))


def build(directory: str) -> str:
    """The tracer's shared object in ``directory`` (compiled once)."""
    so = os.path.join(directory, "malloc_trace.so")
    if not os.path.exists(so):
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise SystemExit("--malloc-trace needs a C compiler (cc) on PATH")
        os.makedirs(directory, exist_ok=True)
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", so, SOURCE, "-ldl"], check=True)
    return so


def preload(directory: str, name: str) -> dict:
    """The environment of one traced run: its files are ``directory/name.<pid>``."""
    prefix = os.path.join(os.path.abspath(directory), name)
    for old in glob.glob(prefix + ".*"):
        os.remove(old)
    return {"LD_PRELOAD": build(os.path.abspath(directory)), "MALLOC_TRACE_OUT": prefix}


def load(directory: str, name: str) -> list:
    """Each traced process's events (processes that marked nothing, a launcher, have no file), by rank (or pid)."""
    files = sorted(glob.glob(os.path.join(directory, name) + ".*"),
                   key=lambda f: int(f.rsplit(".", 1)[1].lstrip("rankpid") or 0))
    runs = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            runs.append([json.loads(line) for line in f])
    return runs


def side_by_side(directory: str, first: str, second: str) -> str:
    """Per rank and event: ``first`` | ``second`` for each figure."""
    lines = [f"malloc_trace: {first} | {second} (MiB unless counted)"]
    for rank, (xs, ys) in enumerate(zip(load(directory, first), load(directory, second))):
        lines.append(f"rank {rank}: event, live, peak live, heap top, its peak, free MiB/chunks, allocations, "
                     "born and alive after (small, large), other threads' allocations")
        for x, y in zip(xs, ys):
            def pair(key, scale=MIB, digits=1, fx=x, fy=y):
                return f"{fx[key] / scale:.{digits}f} | {fy[key] / scale:.{digits}f}"

            lines.append(" ; ".join([
                x["event"][:40].ljust(40), pair("live_bytes"), pair("peak_live_bytes"), pair("brk_bytes"),
                pair("peak_brk_bytes"),
                f"{x['free_bytes'] / MIB:.1f}/{x['free_chunks']} | {y['free_bytes'] / MIB:.1f}/{y['free_chunks']}",
                f"{sum(x['allocs'])} | {sum(y['allocs'])}",
                (f"{sum(x['born_alive'][:SMALL])}, {sum(x['born_alive'][SMALL:])} | "
                 f"{sum(y['born_alive'][:SMALL])}, {sum(y['born_alive'][SMALL:])}"),
                f"{sum(x['other_thread_allocs'])} | {sum(y['other_thread_allocs'])}"]))
    return "\n".join(lines)
