"""Ownership where jobs run: containers (their own PID namespace, the entry point is PID 1), other hosts
(``unshare -u``: another hostname), two commands of one job id. Real ``ptrain run digits`` processes, real
kill -9, real namespaces; the lease is shortened to LEASE seconds (``PTRAIN_LOCK_LEASE_SECONDS``).

Issue 19: 4 (a container killed by kill -9 and restarted), 5 (a second command from another PID namespace or
host touched nothing of the live job), 6 (a second command with the same --job_id).
"""

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
pytestmark = pytest.mark.timeout(300)


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


# ---- 4: a container killed by kill -9 and restarted the same way ------------------------------
@needs_namespaces
def test_container_killed_and_restarted_resumes_after_the_lease(tmp_path, procs):
    """Before: "output_dir ... is in use by live process 1" (the restarted container's own PID 1), exit 2, for good."""
    out, lease = tmp_path / "out", "12"  # longer than ptrain's start-up: the restart meets a lease still running
    cmd = container(digits(out, "--resume_from_checkpoint", "auto"))
    first = Proc(cmd, tmp_path, "first", env=env(PTRAIN_LOCK_LEASE_SECONDS=lease))
    procs.append(first)
    wait_for(lambda: has_checkpoint(out) and (lock_of(out) or {}).get("pid") == 1, "a checkpoint", proc=first)
    first.kill9_entry_point()
    assert first.wait(timeout=60) != 0
    assert lock_of(out)["pid"] == 1  # left behind by the killed container
    done = int((out / "checkpoints" / "latest").read_text().strip()[len("step-"):])
    steps = done + 20
    second = Proc(container(digits(out, "--resume_from_checkpoint", "auto", steps=steps)), tmp_path, "second",
                  env=env(PTRAIN_LOCK_LEASE_SECONDS=lease))
    procs.append(second)
    code = second.wait()
    text = second.output()
    assert code == 0, text[-3000:]
    # the restart says why the lock is stale: the kernel gave the new namespace the old one's id and PID 1 is a
    # younger process; or it waited for the rest of the lease (or, started late, found it expired)
    paths = {"pid reused": "process 1 is gone (the PID now belongs to another process)",
             "waited": f"did not renew its lease of {lease} s", "expired": f"its lease of {lease} s expired"}
    seen = [name for name, line in paths.items() if line in text]
    print("container restart:", seen)
    assert len(seen) == 1, text[-3000:]
    if seen == ["waited"]:  # (after "expired" the namespace may be named or not: the kernel may reuse its id)
        assert "another PID namespace" in text, text[-3000:]
    assert ("waiting up to" in text) == (seen == ["waited"]), text[-3000:]
    assert "resum" in text.lower(), text[-3000:]
    assert not (out / LOCK_NAME).exists() and (out / "checkpoints" / f"step-{steps}").is_dir()
    assert leftovers(first, second) == []


# ---- 5: a second command from another PID namespace / another host touches nothing ------------------
@needs_namespaces
@pytest.mark.parametrize("second", ["other-pid-namespace-same-job", "other-pid-namespace-other-job",
                                    "other-host-same-job"])
def test_second_command_from_elsewhere_is_refused_and_touches_nothing(tmp_path, procs, second):
    """Before: the second command took the owner's PID (2 in its container) for dead, took the lock over and
    deleted the live writer's .tmp-step-N-2: the healthy job died with exit 5."""
    out = tmp_path / "out"
    first = Proc(container(digits(out, "--job_id", "j19"), shell_first=True), tmp_path, "first")
    procs.append(first)
    wait_for(lambda: has_checkpoint(out) and lock_of(out) is not None, "a checkpoint", proc=first)
    owner = lock_of(out)
    assert owner["pid"] != 1  # the shell is PID 1: the owner's PID is one the second container does not have
    in_flight = out / "checkpoints" / f".tmp-step-99999-{owner['pid']}"  # a save of the live writer, in flight
    in_flight.mkdir()
    (in_flight / "model.safetensors").write_bytes(b"x" * 64)
    job = ["--job_id", "j19"] if second.endswith("same-job") else []
    host = "other-node" if second.startswith("other-host") else None
    other = Proc(container(digits(out, *job, steps=40), hostname=host), tmp_path, "second")
    procs.append(other)
    code = other.wait(timeout=120)
    text = other.output()
    assert code == 2, text[-3000:]
    lines = [line for line in text.splitlines() if line.startswith("ptrain: error:")]
    assert len(lines) == 1 and f"output_dir {out} is in use by" in lines[0], text[-3000:]
    assert f"process {owner['pid']} on host" in lines[0]
    if second.endswith("same-job"):
        assert "another command of the same job j19" in lines[0]
    assert in_flight.is_dir() and (in_flight / "model.safetensors").exists()  # nothing of the live job touched
    assert lock_of(out)["token"] == owner["token"] and first.p.poll() is None  # the job still runs, still owns it
    first.tree()[-1].send_signal(signal.SIGTERM)  # the trainer: preempted, saves, exits 143
    assert first.wait(timeout=120) == 143, first.output()[-3000:]
    assert not (out / LOCK_NAME).exists() and leftovers(first, other) == []


# ---- 6: two commands with the same --job_id on one output_dir ----------------------------------
@pytest.mark.parametrize("how", ["--job_id", "PADDLE_JOB_ID"])
def test_second_command_of_the_same_job_id_is_refused(tmp_path, procs, how):
    """Before: both trained from step 0 at once, both exited 0, metrics.jsonl rows of one were lost."""
    out = tmp_path / "out"
    flags = ["--job_id", "same"] if how == "--job_id" else []
    extra = {} if flags else {"PADDLE_JOB_ID": "same"}
    first = Proc(digits(out, *flags), tmp_path, "first", env=env(**extra))
    procs.append(first)
    wait_for(lambda: has_checkpoint(out), "a checkpoint", proc=first)
    owner = lock_of(out)
    second = Proc(digits(out, *flags, steps=40), tmp_path, "second", env=env(**extra))
    procs.append(second)
    code = second.wait(timeout=120)
    text = second.output()
    assert code == 2, text[-3000:]
    assert (f"output_dir {out} is in use by another command of the same job same (process {first.p.pid} on host"
            in text), text[-3000:]
    assert lock_of(out)["token"] == owner["token"] and first.p.poll() is None
    first.p.send_signal(signal.SIGTERM)
    assert first.wait(timeout=120) == 143, first.output()[-3000:]
    steps = metric_steps(out)
    assert steps == sorted(set(steps)) and steps[0] == 20  # one run's rows, in order, none lost or doubled
    assert not (out / LOCK_NAME).exists() and leftovers(first, second) == []
