"""A crashed rank: the job stops at once; with --max_restarts it resumes and ends as if never hurt."""

import glob
import os
import signal
import subprocess
import sys
import time

import numpy as np
from helpers import REPO
from patience import patience
from safetensors.numpy import load_file

RUN = ["run", "digits", "--nproc", "2", "--num_train_epochs", "24", "--save_strategy", "steps",
       "--save_steps", "100", "--evaluation_strategy", "no", "--disable_tqdm", "true", "--logging_steps", "100"]
ENV = dict(os.environ, PYTHONPATH=REPO)


def final_model(out):
    latest = open(os.path.join(out, "checkpoints", "latest")).read().strip()
    return latest, load_file(os.path.join(out, "checkpoints", latest, "model.safetensors"))


def rank_pid(out_dir, rank):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "launch_entry.py" in cmd and out_dir in cmd and f"PADDLE_TRAINER_ID={rank}" in env:
            return int(pid)
    return None


def test_killed_rank_restarts_from_checkpoint_and_matches_uninterrupted_run(tmp_path):
    ref, hurt = str(tmp_path / "ref"), str(tmp_path / "hurt")
    done = subprocess.run([sys.executable, "-m", "trainer.cli", *RUN, "--output_dir", ref], env=ENV,
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    proc = subprocess.Popen([sys.executable, "-m", "trainer.cli", *RUN, "--output_dir", hurt, "--max_restarts", "1"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.time() + patience(120)
    while not glob.glob(os.path.join(hurt, "checkpoints", "step-*")) and time.time() < deadline:
        time.sleep(0.05)
    pid = rank_pid(hurt, 1)
    assert pid, "rank 1 not found"
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=patience(300))
    assert proc.returncode == 0, err[-3000:]
    assert "restart 1 of 1 from the latest checkpoint" in err
    step_ref, want = final_model(ref)
    step_hurt, got = final_model(hurt)
    assert step_hurt == step_ref
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_crashed_rank_without_restarts_ends_the_job_fast_and_names_the_log(tmp_path):
    out = str(tmp_path / "crash")
    proc = subprocess.Popen([sys.executable, "-m", "trainer.cli", *RUN, "--output_dir", out], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.time() + patience(120)
    while not glob.glob(os.path.join(out, "checkpoints", "step-*")) and time.time() < deadline:
        time.sleep(0.05)
    os.kill(rank_pid(out, 1), signal.SIGKILL)
    killed_at = time.time()
    _, err = proc.communicate(timeout=patience(120))
    assert proc.returncode != 0 and time.time() - killed_at < 30
    assert "failed with exit code" in err and "launch_logs" in err
