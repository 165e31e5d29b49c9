"""Failures named by what happened (issue 19, item 9): a DataLoader worker killed by SIGKILL is reported with the
signal and a restartable code; a DataError on rank 1 alone reaches ptrain's console and exits 3 with no restart;
the advice after etcd is lost is a command that works. Real processes, real signals, real launches."""

import os
import shlex
import signal
import subprocess
import sys
import time

import psutil
from helpers import REPO, free_port

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")
from patience import patience
ENV = dict(os.environ, PYTHONPATH=REPO)
PTRAIN = [sys.executable, "-m", "trainer.cli"]


def test_a_dataloader_worker_killed_by_sigkill_is_named_and_restartable(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(PTRAIN + ["run", "digits", "--output_dir", str(out), "--max_steps", "100000",
                                      "--dataloader_num_workers", "2", "--disable_tqdm", "true", "--logging_steps", "5",
                                      "--report_to", "jsonl", "--evaluation_strategy", "no"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, victim = time.time() + patience(120), None
        while victim is None:
            assert proc.poll() is None and time.time() < deadline, "no DataLoader worker appeared"
            kids = psutil.Process(proc.pid).children() if (out / "metrics.jsonl").exists() else []
            victim = kids[0] if kids else None
            time.sleep(0.05)
        victim.kill()  # what the OOM killer does
        _, stderr = proc.communicate(timeout=patience(120))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 137, stderr[-3000:]
    (line,) = [x for x in stderr.splitlines() if x.startswith("ptrain: error")]
    assert f"a DataLoader worker (pid {victim.pid}) was killed by SIGKILL" in line and "raised" not in line.split(":")[2]
    assert "--max_restarts restarts" in line


def test_a_data_error_on_rank_1_alone_exits_3_on_ptrains_console_without_restart(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(PTRAIN + ["launch", "--nproc", "2", "--max_restarts", "1", "--master",
                                    f"127.0.0.1:{free_port()}", os.path.join(WORKERS, "data_error_toy.py"), str(out)],
                          env=ENV, capture_output=True, text=True, timeout=patience(300), cwd=tmp_path)
    text = done.stdout + done.stderr
    assert done.returncode == 3, text[-3000:]
    assert "ptrain: rank 1 failed (exit 3): DataError: sample" in done.stderr, text[-3000:]
    assert "restart 1 of" not in text


def test_the_advice_after_etcd_is_lost_is_a_command_that_works(tmp_path):
    master = f"127.0.0.1:{free_port()}"  # nothing listens there: etcd is gone
    cmd = ["run", "digits", "--output_dir", "run", "--max_steps", "20", "--master", f"etcd://{master}",
           "--job_id", "j19", "--elastic_timeout", "6"]
    done = subprocess.run(PTRAIN + cmd, env=ENV, capture_output=True, text=True, timeout=patience(240), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if "unreachable" in x]
    advised = line.split("then run ", 1)[1].split(" (it resumes")[0]
    assert advised.startswith("ptrain run digits") and "--resume_from_checkpoint auto" in advised
    # the job left checkpoints: a new command of the same job is refused unless it resumes, the advised one is not
    first = subprocess.run(PTRAIN + ["run", "digits", "--output_dir", "run", "--max_steps", "10", "--save_steps", "5",
                                     "--disable_tqdm", "true"], env=ENV, capture_output=True, text=True, timeout=patience(240),
                           cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    same = subprocess.run(PTRAIN + cmd, env=ENV, capture_output=True, text=True, timeout=patience(240), cwd=tmp_path)
    assert "holds checkpoints of an earlier run" in same.stderr
    again = subprocess.run(PTRAIN + shlex.split(advised)[1:], env=ENV, capture_output=True, text=True, timeout=patience(240),
                           cwd=tmp_path)
    assert again.returncode == 2 and "holds checkpoints" not in again.stderr and "unreachable" in again.stderr, \
        again.stderr


def test_kill_9_of_rank_0_during_saves_is_reported_as_137(tmp_path):
    """paddle's launcher passes a rank's death by SIGKILL on as 247 (256 - 9): ptrain reports 137, documented."""
    out = tmp_path / "run"
    proc = subprocess.Popen(PTRAIN + ["run", "digits", "--nproc", "2", "--master", f"127.0.0.1:{free_port()}",
                                      "--output_dir", str(out), "--max_steps", "100000", "--save_steps", "1",
                                      "--save_total_limit", "2", "--logging_steps", "5", "--report_to", "jsonl",
                                      "--evaluation_strategy", "no", "--disable_tqdm", "true"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + patience(180)
        while not (out / "checkpoints" / "latest").exists():
            assert proc.poll() is None and time.time() < deadline, "no checkpoint was saved"
            time.sleep(0.05)
        ranks = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if "launch_entry" in " ".join(p.cmdline()) and p.environ().get("PADDLE_TRAINER_ID") == "0"]
        ranks[0].send_signal(signal.SIGKILL)
        text, _ = proc.communicate(timeout=patience(120))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 137, text[-3000:]
    # paddle's 247 is never reported; ptrain says 137, or (when the surviving rank recorded an error of its own
    # while rank 0 died, seen once under a loaded full run) names that rank's error, and still exits 137
    assert "exit code 247" not in text and "(exit 247)" not in text
    assert "exit code 137" in text or " failed (exit " in text, text[-3000:]
