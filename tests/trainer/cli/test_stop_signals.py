"""Signals as schedulers send them to ``ptrain run`` (issue 19, item 8): SIGHUP (a closed terminal) is SIGTERM,
SIGUSR1 (Slurm's ``--signal=USR1@N``) saves and exits 138 to be requeued, a preemption saves even with
``--save_strategy no`` unless ``--save_on_preemption false``, and the exit line says exactly what is on disk.
Real processes, real signals."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers import REPO
from patience import patience

from trainer.checkpoint.manifest import verify


def start(tmp_path, *flags, wrapper=(), preexec_fn=None):
    out = tmp_path / "run"
    cmd = [*wrapper, sys.executable, "-m", "trainer.cli", "run", "digits", "--output_dir", str(out), "--max_steps", "100000",
           "--logging_steps", "5", "--report_to", "jsonl", "--evaluation_strategy", "no", "--disable_tqdm", "true",
           *flags]
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, preexec_fn=preexec_fn)
    return proc, out


def wait_for_rows(proc, out, rows=1) -> int:
    """Until the run's metrics.jsonl holds ``rows`` records (the run is training); how many it holds."""
    metrics = out / "metrics.jsonl"

    def held() -> int:
        return len(metrics.read_text().splitlines()) if metrics.exists() else 0

    deadline = time.time() + patience(120)
    while held() < rows:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    return held()


def signal_when_training(proc, out, sig):
    wait_for_rows(proc, out)
    kids = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(sig)
    try:
        stdout, stderr = proc.communicate(timeout=patience(90))
    finally:
        for p in kids + [psutil.Process(proc.pid)] if proc.poll() is None else kids:
            if p.is_running():
                p.kill()
    assert not [p for p in kids if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    return stderr


def saved_steps(out):
    root = out / "checkpoints"
    return sorted(int(n[5:]) for n in os.listdir(root) if n.startswith("step-")) if root.exists() else []


@pytest.mark.parametrize("sig,code", [(signal.SIGHUP, 143), (signal.SIGUSR1, 138)])
def test_sighup_and_sigusr1_save_and_exit_with_their_code_even_with_save_strategy_no(tmp_path, sig, code):
    proc, out = start(tmp_path, "--save_strategy", "no")
    stderr = signal_when_training(proc, out, sig)
    assert proc.returncode == code, stderr[-3000:]
    (step,) = saved_steps(out)
    verify(str(out / "checkpoints" / f"step-{step}"))
    assert not (out / ".ptrain.lock").exists()
    (line,) = [x for x in stderr.splitlines() if x.startswith("ptrain: preempted")]
    assert f"preempted at step {step}; checkpoint {out}/checkpoints/step-{step} of step {step} is saved and verifies" \
        in line, line
    assert ("requeue the job (exit 138" in line) == (sig == signal.SIGUSR1)
    assert line.endswith("resume with --resume_from_checkpoint auto")


def test_save_on_preemption_false_saves_nothing_and_says_so(tmp_path):
    proc, out = start(tmp_path, "--save_strategy", "no", "--save_on_preemption", "false")
    stderr = signal_when_training(proc, out, signal.SIGTERM)
    assert proc.returncode == 143, stderr[-3000:]
    assert saved_steps(out) == []
    (line,) = [x for x in stderr.splitlines() if x.startswith("ptrain: preempted")]
    assert "was saved and none is on disk" in line and "(--save_on_preemption false)" in line, line
    assert "would start fresh" in line and "checkpoint saved" not in line
    assert not (out / ".ptrain.lock").exists()
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["step"] >= 5


def test_under_nohup_a_closed_terminal_does_not_stop_the_run(tmp_path):
    """``nohup ptrain run ... &``: nohup starts ptrain with SIGHUP ignored, and it stays ignored (the run goes on when
    the terminal closes); SIGTERM still saves and stops. Without nohup the same SIGHUP stops it (the test above)."""
    proc, out = start(tmp_path, "--save_strategy", "no", wrapper=["nohup"])
    rows = wait_for_rows(proc, out)
    for p in [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True):
        p.send_signal(signal.SIGHUP)  # the terminal closing: every process of the session gets it
    wait_for_rows(proc, out, rows + 3)  # 15 more steps logged after the SIGHUP
    stderr = signal_when_training(proc, out, signal.SIGTERM)
    assert proc.returncode == 143, stderr[-3000:]
    assert "received SIGHUP" not in stderr and "received SIGTERM" in stderr, stderr[-3000:]
    (step,) = saved_steps(out)
    verify(str(out / "checkpoints" / f"step-{step}"))


def test_started_with_sigterm_blocked_it_still_saves_and_stops(tmp_path):
    """A parent that spawned ptrain while SIGTERM was blocked in its thread (a blocked signal is inherited across
    exec, as some libraries' helpers do it around a spawn): ptrain unblocks the stop signals it handles, so SIGTERM
    still saves and exits 143 (its handler would otherwise never run, and the run would go on to its end)."""
    proc, out = start(tmp_path, "--save_strategy", "no",
                      preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM]))
    stderr = signal_when_training(proc, out, signal.SIGTERM)
    assert proc.returncode == 143, stderr[-3000:]
    (step,) = saved_steps(out)
    verify(str(out / "checkpoints" / f"step-{step}"))
