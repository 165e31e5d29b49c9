"""A preempted run's exit code reaches the shell without the script calling sys.exit, and the
documented post-fit code (evaluate(), predict()) neither hangs nor dies in a collective.

Before: under ``ptrain launch``, a script that simply returned after a Ctrl-C'd fit() ended with
exit 0 (exit-codes.md promises 130); one that called ``trainer.evaluate()`` afterwards died in gloo
in 2 of 5 runs ("Connection reset by peer": rank 1 had gone). After: fit() hands the code to the
process (trainer.process.hand_off_exit_code), and evaluate()/predict() after a preempted fit()
raise trainer.errors.Preempted on every rank at the same call: one line, exit 130.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import REPO, preemption_env

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "post_fit_toy.py")
from patience import patience



def _wait_for_step_20(proc, out, ranks):
    deadline = time.time() + patience(240)
    while not all(os.path.exists(os.path.join(out, f"at-20-rank{r}")) for r in range(ranks)):
        assert proc.poll() is None, f"ended early: {proc.communicate()[0][-3000:]}"
        assert time.time() < deadline, "step 20 never came"
        time.sleep(0.1)


@pytest.mark.parametrize("after", ["none", "evaluate", "predict"])
def test_ctrl_c_under_ptrain_launch_exits_130_whatever_follows_fit(tmp_path, after):
    out = str(tmp_path / "out")
    os.makedirs(out)
    cmd = [sys.executable, "-m", "trainer.cli", "launch", "--nproc", "2", "--log_dir", str(tmp_path / "logs"),
           WORKER, out, after]
    proc = subprocess.Popen(cmd, env=preemption_env(), cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    _wait_for_step_20(proc, out, 2)
    proc.send_signal(signal.SIGINT)  # a Ctrl-C reaches ptrain alone (the launcher has its own process group)
    text, _ = proc.communicate(timeout=patience(180))
    logs = "".join(open(os.path.join(tmp_path, "logs", n), errors="replace").read()
                   for n in sorted(os.listdir(tmp_path / "logs")) if n.startswith("workerlog"))
    assert proc.returncode == 130, text[-3000:] + logs[-3000:]
    for rank in (0, 1):
        assert open(os.path.join(out, f"fit-rank{rank}")).read() == "preempted 130"
        assert not os.path.exists(os.path.join(out, f"after-rank{rank}")) or after == "none"
    assert "received SIGINT" in logs and "received SIGTERM" not in logs
    assert "Connection reset" not in logs and "Traceback" not in logs, logs[-3000:]
    if after != "none":
        line = f"ptrain: {after}() after a preempted fit() (SIGINT): skipped on every rank"
        assert logs.count(line) == 2, logs[-3000:]  # one line per rank, no traceback


def test_ctrl_c_to_a_plain_python_script_exits_130(tmp_path):
    """One process, ``python script.py``: the script returns after fit(); the shell sees 130."""
    out = str(tmp_path / "out")
    os.makedirs(out)
    proc = subprocess.Popen([sys.executable, WORKER, out, "none"], env=preemption_env(), cwd=str(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for_step_20(proc, out, 1)
    proc.send_signal(signal.SIGINT)
    text, _ = proc.communicate(timeout=patience(120))
    assert proc.returncode == 130, text[-3000:]
    assert open(os.path.join(out, "fit-rank0")).read() == "preempted 130"
    assert open(os.path.join(out, "after-rank0")).read() == "ran on"  # the script's own code after fit() ran


def test_a_completed_run_and_a_failing_script_keep_their_codes():
    """Nothing is handed off unless a fit() was preempted; a script that raises keeps Python's 1."""
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from trainer import process\n"
            "process.hand_off_exit_code(130)\n"
            "process.hand_off_exit_code(0)\n"
            "print('done')\n") % REPO
    assert subprocess.run([sys.executable, "-c", code], env=preemption_env()).returncode == 0
    failing = ("import sys; sys.path.insert(0, %r)\n"
               "from trainer import process\n"
               "process.hand_off_exit_code(143)\n"
               "raise RuntimeError('the script failed')\n") % REPO
    run = subprocess.run([sys.executable, "-c", failing], env=preemption_env(), capture_output=True, text=True)
    assert run.returncode == 1 and "RuntimeError: the script failed" in run.stderr


def test_under_the_raw_launcher_a_rank_says_where_its_sigterm_came_from(tmp_path):
    """A Ctrl-C to a raw ``paddle.distributed.launch`` reaches each rank as the launcher's SIGTERM. Before: the
    rank said "received SIGTERM" alone; after: it says the SIGTERM is the launcher's, which it sends after a
    Ctrl-C too. The ranks still stop at the same step and exit 143 (the script calls evaluate(): one line)."""
    from helpers import free_port

    out = str(tmp_path / "out")
    os.makedirs(out)
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--master",
           f"127.0.0.1:{free_port()}", "--log_dir", str(tmp_path / "logs"), WORKER, out, "evaluate"]
    proc = subprocess.Popen(cmd, env=preemption_env(), cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    _wait_for_step_20(proc, out, 2)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=patience(180))
    logs = [open(os.path.join(tmp_path, "logs", f"workerlog.{r}"), errors="replace").read() for r in (0, 1)]
    assert "received SIGTERM from paddle's launcher, which stops its ranks with SIGTERM also after a Ctrl-C" in logs[0]
    for rank, log in enumerate(logs):  # (rank 1 logs errors only)
        assert open(os.path.join(out, f"fit-rank{rank}")).read() == "preempted 143"
        assert "Connection reset" not in log
