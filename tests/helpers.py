"""Helpers for the tests: tiny real datasets and models, free ports, a launcher."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import numpy as np
import paddle

from callbacks import Callback
from patience import patience

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ToyDataset(paddle.io.Dataset):
    """n samples of 8 features; label = whether the features sum above 0."""

    def __init__(self, n: int = 96, seed: int = 0, features: int = 8):
        rng = np.random.RandomState(seed)
        self.x = rng.randn(n, features).astype("float32")
        self.y = (self.x.sum(1) > 0).astype("int64")

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class StopAt(Callback):
    """Stops the run (``state.should_stop``) at the end of optimizer step ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, trainer):
        if trainer.state.global_step == self.step:
            trainer.state.should_stop = True


def make_mlp(seed: int = 0, features: int = 8, hidden: int = 16, classes: int = 2) -> paddle.nn.Layer:
    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Linear(features, hidden), paddle.nn.ReLU(), paddle.nn.Linear(hidden, classes))


def params_of(model: paddle.nn.Layer) -> dict:
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: str, args, nproc: int, log_dir: str, timeout: int = 240) -> subprocess.CompletedProcess:
    """Run ``script`` under ``python -m paddle.distributed.launch`` with ``nproc`` CPU processes."""
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
           "--master", f"127.0.0.1:{free_port()}", "--log_dir", log_dir, script, *map(str, args)]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=patience(timeout), env=env, cwd=REPO)
    if proc.returncode != 0:
        logs = ""
        for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
            if name.startswith("workerlog"):
                with open(os.path.join(log_dir, name), errors="replace") as f:
                    logs += f"\n--- {name}\n" + f.read()[-3000:]
        raise AssertionError(f"launch failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}{logs}")
    return proc


def process_tree(pid: int) -> list:
    """``pid`` and every descendant as psutil processes; empty once ``pid`` is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def wait_for(path, proc, timeout=120):
    """Until ``path`` exists; an AssertionError (with the end of its stderr) when ``proc`` ends first."""
    deadline = time.time() + patience(timeout)
    while time.time() < deadline:
        if os.path.exists(path):
            return
        if proc.poll() is not None:
            raise AssertionError(f"ended early ({proc.returncode}): {proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {path}")


def gone_within(pids, timeout):
    """The pids still running (not zombies) after ``timeout`` seconds, killed; [] when all ended."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    deadline = time.time() + patience(timeout)
    while time.time() < deadline:
        left = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not left:
            return []
        time.sleep(0.1)
    for p in left:
        p.kill()
    return [p.pid for p in left]


def kill_trees(procs) -> None:
    """Kill each started process and its descendants, then forget them: a failed assertion must not leave
    a run (or its workers) behind."""
    for proc in procs:
        for p in process_tree(proc.pid):
            try:
                p.kill()
            except Exception:  # noqa: BLE001 - psutil.Error: gone meanwhile
                pass
    procs.clear()
