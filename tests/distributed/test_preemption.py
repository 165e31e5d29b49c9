"""SIGTERM: the run saves at an agreed step, exits 143, and resumes exactly."""

import glob
import os
import signal
import subprocess
import sys
import time

import numpy as np
from helpers import REPO, free_port

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "preempt_toy.py")
from patience import patience
ENV = dict(os.environ, PYTHONPATH=REPO)


def wait_for(pattern, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if glob.glob(pattern):
            return
        if proc.poll() is not None:
            raise AssertionError(f"worker ended early ({proc.returncode}): {proc.stderr.read()[-2000:] if proc.stderr else ''}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {pattern}")


def final_params(out, rank=0):
    (path,) = glob.glob(os.path.join(out, f"final-rank{rank}-*.npz"))
    return dict(np.load(path)), path


def test_sigterm_saves_exits_143_and_resume_is_exact(tmp_path):
    ref = str(tmp_path / "ref")
    run = str(tmp_path / "run")
    os.makedirs(ref)
    os.makedirs(run)
    subprocess.run([sys.executable, WORKER, ref, "60"], check=True, env=ENV, capture_output=True)
    proc = subprocess.Popen([sys.executable, WORKER, run, "60"], env=ENV, stderr=subprocess.PIPE, text=True)
    wait_for(os.path.join(run, "at-20-rank0"), proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=patience(60))
    assert proc.returncode == 143, err[-2000:]
    params, path = final_params(run)
    assert path.endswith("preempted.npz") and 20 <= int(params["step"]) < 60
    latest = open(os.path.join(run, "checkpoints", "latest")).read().strip()
    assert latest == f"step-{int(params['step'])}"
    os.remove(path)
    resumed = subprocess.run([sys.executable, WORKER, run, "60", "resume"], env=ENV, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    got, _ = final_params(run)
    want, _ = final_params(ref)
    assert int(got["step"]) == 60
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_sigterm_to_one_rank_stops_both_at_the_same_step(tmp_path):
    out = str(tmp_path / "dp")
    os.makedirs(out)
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--master",
           f"127.0.0.1:{free_port()}", "--log_dir", str(tmp_path / "logs"), WORKER, out, "400"]
    launcher = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(os.path.join(out, "at-20-rank1"), launcher)
    with open(os.path.join(out, "at-20-rank1")) as f:
        rank1_pid = int(f.read())
    # signal only rank 1: both ranks must agree and stop at the same step
    os.kill(rank1_pid, signal.SIGTERM)
    launcher.communicate(timeout=patience(120))
    p0, path0 = final_params(out, 0)
    p1, path1 = final_params(out, 1)
    assert path0.endswith("preempted.npz") and path1.endswith("preempted.npz")
    assert int(p0["step"]) == int(p1["step"]) < 400
    for k in p0:
        np.testing.assert_array_equal(p0[k], p1[k])
    latest = open(os.path.join(out, "checkpoints", "latest")).read().strip()
    assert latest == f"step-{int(p0['step'])}"
