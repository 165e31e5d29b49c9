"""Real ``ptrain run digits`` processes for the ownership tests: containers (``unshare``: their own PID
namespace, optionally another hostname), a shortened lease (LEASE seconds), their process trees and logs."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers import REPO, process_tree

from trainer.checkpoint.lock import JOB_ENV, LOCK_NAME, OWNER_ENV

LEASE = "3"


def _can_unshare() -> str:
    if not shutil.which("unshare"):
        return "unshare (util-linux) is not installed"
    try:
        done = subprocess.run(["unshare", "-u", "-fp", "--mount-proc", "sh", "-c", "hostname x-node && echo $$"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if done.returncode != 0 or done.stdout.strip() != "1":
        return f"this machine cannot make PID/UTS namespaces (needs root): {done.stderr.strip()[:200]}"
    return ""


NO_NAMESPACES = _can_unshare()
needs_namespaces = pytest.mark.skipif(bool(NO_NAMESPACES), reason=NO_NAMESPACES or "namespaces available")


def env(**extra):
    e = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
             PTRAIN_LOCK_LEASE_SECONDS=LEASE)
    e.update(extra)
    for name in (JOB_ENV, OWNER_ENV, "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_JOB_ID"):
        if name not in extra:
            e.pop(name, None)
    return e


def digits(out, *flags, steps=100000):
    return [sys.executable, "-m", "trainer.cli", "run", "digits", "--output_dir", str(out), "--max_steps", str(steps),
            "--save_steps", "20", "--save_total_limit", "2", "--evaluation_strategy", "no", "--report_to", "jsonl",
            *flags]


def container(cmd, hostname=None, shell_first=False):
    """``cmd`` as the entry point of a container: PID 1 of a new PID namespace (``hostname``: also a new UTS
    namespace, i.e. another host). ``shell_first``: a shell is PID 1 and ``cmd`` runs as its child."""
    line = " ".join(f"'{c}'" for c in cmd)
    script = (f"hostname {hostname} && " if hostname else "") + (f"{line}; exit $?" if shell_first else f"exec {line}")
    return ["unshare", *(["-u"] if hostname else []), "-fp", "--mount-proc", "sh", "-c", script]


class Proc:
    def __init__(self, cmd, tmp, name, **kw):
        self.log = open(os.path.join(str(tmp), f"{name}.log"), "w+")
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                                  env=kw.pop("env", None) or env(), **kw)

    def tree(self):
        return process_tree(self.p.pid)

    def kill9_entry_point(self):
        """kill -9 of the container's PID 1 (the OOM killer's way): the kernel then kills the whole namespace."""
        children = psutil.Process(self.p.pid).children()
        (children[0] if children else psutil.Process(self.p.pid)).send_signal(signal.SIGKILL)

    def wait(self, timeout=240):
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise

    def output(self):
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def stop(self):
        for p in self.tree():
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        self.p.wait(timeout=30)
        self.log.close()


@pytest.fixture
def procs():
    started = []
    yield started
    for proc in started:  # leave nothing behind
        if proc.p.poll() is None or proc.tree():
            proc.stop()


def wait_for(condition, what, timeout=120, proc=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        if proc is not None and proc.p.poll() is not None:
            raise AssertionError(f"{what}: the process ended with {proc.p.returncode}:\n{proc.output()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def lock_of(out):
    try:
        return json.loads((out / LOCK_NAME).read_text())
    except (OSError, ValueError):
        return None


def has_checkpoint(out):
    return (out / "checkpoints" / "latest").exists()


def metric_steps(out):
    with open(out / "metrics.jsonl") as f:
        return [json.loads(line)["step"] for line in f if '"loss"' in line]


def leftovers(*procs_):
    return [p for proc in procs_ for p in proc.tree() if p.status() != psutil.STATUS_ZOMBIE]
