"""Preemption as clusters deliver it: real signals to real process trees (launcher, ranks, ptrain).

Every test checks what the issue asked: every rank stops at the same step, the newest
step is saved as a verified checkpoint, the exit codes, the time to exit, and that no
process of the job is left.
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import job_tree
import psutil
import pytest
from helpers import REPO, free_port, preemption_env
from job_tree import alive, assert_all_gone, cmdline, latest_checkpoint
from patience import patience

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")
TOY = os.path.join(WORKERS, "preempt_toy.py")
LIFETIME = os.path.join(WORKERS, "lifetime_toy.py")

PTRAIN = [sys.executable, "-m", "trainer.cli"]


def wait_for(predicate, proc, timeout=180, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"process ended early ({proc.returncode}) waiting for {what}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


_SEEN = []  # every process a test's job had: killed at teardown if a failed assertion left it running


@pytest.fixture(autouse=True)
def _no_leftovers():
    yield
    for p in alive(_SEEN):
        p.kill()
    _SEEN.clear()


def tree(pid):
    return job_tree.tree(pid, _SEEN)


def raw_launch(tmp_path, out, steps=400):
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--master",
           f"127.0.0.1:{free_port()}", "--log_dir", str(tmp_path / "logs"), TOY, out, str(steps)]
    return subprocess.Popen(cmd, env=preemption_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def toy_results(out):
    codes = [int(open(os.path.join(out, f"code-rank{r}")).read()) for r in (0, 1)]
    finals = [glob.glob(os.path.join(out, f"final-rank{r}-*.npz")) for r in (0, 1)]
    return codes, finals


@pytest.mark.parametrize("who,sig,launcher_code", [("launcher", signal.SIGTERM, 15), ("everyone", signal.SIGTERM, 15),
                                                   ("launcher", signal.SIGINT, 2)])
def test_signal_to_raw_launcher_or_every_process(tmp_path, who, sig, launcher_code):
    """A raw ``paddle.distributed.launch`` (no ptrain). The launcher turns SIGTERM or Ctrl-C into
    SIGTERM to each rank, 3 times 0.2 s apart (and a cluster may also signal every process): no
    repeat counts as "exit now"; both ranks save the same step, release the lock and exit 143;
    the launcher exits with paddle's own code (its signal number)."""
    out = str(tmp_path / "out")
    os.makedirs(out)
    launcher = raw_launch(tmp_path, out)
    wait_for(lambda: os.path.exists(os.path.join(out, "at-20-rank1")), launcher, what="step 20")
    procs = tree(launcher.pid)
    t0 = time.time()
    targets = [p.pid for p in procs if p.pid == launcher.pid or "preempt_toy" in cmdline(p)] \
        if who == "everyone" else [launcher.pid]
    for pid in targets:
        os.kill(pid, sig)
    code = launcher.wait(timeout=patience(120))
    elapsed = time.time() - t0
    assert code == launcher_code  # paddle's launcher, signalled itself, exits with the signal number (documented)
    codes, finals = toy_results(out)
    assert codes == [143, 143]
    assert all(len(f) == 1 and f[0].endswith("preempted.npz") for f in finals)
    step = latest_checkpoint(out)
    assert step > 20
    assert not os.path.exists(os.path.join(out, ".ptrain.lock"))
    assert elapsed < 60
    assert_all_gone(procs)


def _ptrain_run(tmp_path, *extra, nproc=2):
    out = str(tmp_path / "run")
    cmd = PTRAIN + ["run", "digits", "--nproc", str(nproc), "--output_dir", out, "--num_train_epochs", "500",
                    "--report_to", "jsonl", "--logging_steps", "5", "--save_strategy", "steps", "--save_steps",
                    "100000", "--evaluation_strategy", "no", *extra]
    proc = subprocess.Popen(cmd, env=preemption_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, out


def _logged_step(out):
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return 0
    steps = [json.loads(line).get("step", 0) for line in open(path) if line.strip()]
    return max(steps or [0])


def _launcher_exit_code(text):
    """paddle's launcher logs ``Exit code N`` (finalize) or ``Exit with signal N`` (signalled itself)."""
    codes = [line.rsplit(" ", 1)[1] for line in text.splitlines() if "LAUNCH INFO" in line and "Exit " in line]
    return int(codes[-1]) if codes else None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_ptrain_is_forwarded(tmp_path, sig):
    """What Kubernetes does (SIGTERM to ptrain as PID 1), or a Ctrl-C: the ranks save and exit
    128 + signal, so do the launcher and ptrain; --max_restarts does not relaunch; nothing is left."""
    proc, out = _ptrain_run(tmp_path, "--max_restarts", "2", "--verbose")  # --verbose: the launcher's INFO exit line
    wait_for(lambda: _logged_step(out) >= 20, proc, what="step 20")
    procs = tree(proc.pid)
    t0 = time.time()
    proc.send_signal(sig)
    text, _ = proc.communicate(timeout=patience(120))
    elapsed = time.time() - t0
    assert proc.returncode == 128 + sig, text[-3000:]
    assert _launcher_exit_code(text) == 128 + sig, text[-3000:]
    assert "restart 1 of" not in text
    assert latest_checkpoint(out) >= 20
    assert not os.path.exists(os.path.join(out, ".ptrain.lock"))
    assert elapsed < 60
    assert_all_gone(procs, timeout=patience(10))


@pytest.mark.parametrize("victim", ["ptrain", "launcher"])
def test_sigkill_leaves_no_process(tmp_path, victim):
    """SIGKILL of ptrain or of the launcher: the rest of the job dies with it (parent-death
    signals); the ranks still stop together and save."""
    proc, out = _ptrain_run(tmp_path)
    wait_for(lambda: _logged_step(out) >= 20, proc, what="step 20")
    procs = tree(proc.pid)
    launcher = [p for p in procs if "paddle.distributed.launch" in cmdline(p)][0]
    (launcher if victim == "launcher" else psutil.Process(proc.pid)).kill()
    assert_all_gone(procs, timeout=patience(60))
    proc.communicate(timeout=patience(30))
    assert proc.returncode == (-9 if victim == "ptrain" else 137)
    assert latest_checkpoint(out) >= 20  # each rank got SIGTERM from its dying parent and saved


def test_sigterm_during_startup_exits_143_promptly(tmp_path):
    """SIGTERM while the ranks import paddle and rendezvous: out in seconds, with 143."""
    proc, out = _ptrain_run(tmp_path)

    def ranks_started():
        count = 0
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            return False
        for child in children:
            try:
                count += "launch_entry" in " ".join(child.cmdline())
            except psutil.Error:  # a short-lived helper process, or a zombie
                pass
        return count >= 2

    wait_for(ranks_started, proc, what="two ranks")
    time.sleep(1.0)
    procs = tree(proc.pid)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=patience(120))
    elapsed = time.time() - t0
    assert proc.returncode == 143, text[-3000:]
    assert elapsed < patience(20), text[-3000:]  # seconds, not gloo's timeout of minutes
    assert_all_gone(procs, timeout=patience(10))


def test_preemption_makes_no_host_sync_per_step(tmp_path):
    """Two processes, Preemption on: 0 device-to-host syncs in every non-logging step
    (the agreement goes through the TCPStore, not through a device tensor)."""
    out = str(tmp_path / "syncs")
    os.makedirs(out)
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--master",
           f"127.0.0.1:{free_port()}", "--log_dir", str(tmp_path / "logs"), LIFETIME, out, "syncs"]
    subprocess.run(cmd, env=preemption_env(), check=True, timeout=patience(240), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for rank in (0, 1):
        got = json.load(open(os.path.join(out, f"syncs-rank{rank}.json")))
        assert got["per_step"] == [0] * 9, got["sources"][:3]
