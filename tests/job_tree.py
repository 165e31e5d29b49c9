"""A launched job's processes and what it left on disk, for the tests that stop jobs with real signals: its
process tree, which of them still run, that none is left, and the newest checkpoint once it verifies."""

from __future__ import annotations

import os
import time

import psutil

from trainer.checkpoint.manifest import verify


def tree(pid, seen=None):
    """pid and every descendant, as psutil processes (create time kept to be immune to pid reuse); also added to
    ``seen`` (a list a fixture kills at teardown) when given."""
    root = psutil.Process(pid)
    procs = [root] + root.children(recursive=True)
    if seen is not None:
        seen.extend(procs)
    return procs


def cmdline(p):
    try:
        return " ".join(p.cmdline())
    except psutil.Error:  # gone, or a zombie helper
        return ""


def alive(procs):
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def assert_all_gone(procs, timeout=30):
    deadline = time.time() + timeout
    while alive(procs) and time.time() < deadline:
        time.sleep(0.1)
    left = alive(procs)
    for p in left:
        p.kill()
    assert not left, f"left running: {[(p.pid, cmdline(p)[-120:]) for p in left]}"


def latest_checkpoint(out):
    """The step of ``out``'s newest checkpoint, after checking every file of it against its manifest."""
    with open(os.path.join(out, "checkpoints", "latest")) as f:
        name = f.read().strip()
    verify(os.path.join(out, "checkpoints", name))
    return int(name.split("-")[1])
