"""A user's script refused by a project error is never restarted (issue 40 item 4): a ConfigError (2) or a
DataError (3) raised outside fit() -- by TrainingArguments, by Trainer(...), by the script itself -- ends a job of
``ptrain launch --max_restarts N`` (and ``ptrain run --nproc N``) with its code after one launch, and the last
line names the error. Real launches of real scripts; the launches are counted by the file the script appends to."""

import os
import re
import subprocess
import sys

import pytest
from helpers import REPO, free_port
from patience import patience

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")
ENV = dict(os.environ, PYTHONPATH=REPO)
PTRAIN = [sys.executable, "-m", "trainer.cli"]


def launches(tmp_path):
    return (tmp_path / "launches").read_text().split()


@pytest.mark.parametrize("mode, code, named", [
    ("config", 2, "ConfigError: tensor_parallel_degree=3 does not divide the 2 ranks"),
    ("data-on-rank-1", 3, "rank 1 failed (exit 3): DataError:"),
    # no record: the code the launcher logged for rank 1, not rank 0's SIGTERM from the launcher (restartable 1)
    ("exit-3-on-rank-1", 3, "the run failed with exit code 3"),
])
def test_a_refused_script_under_ptrain_launch_ends_with_its_code_after_one_launch(tmp_path, mode, code, named):
    done = subprocess.run(PTRAIN + ["launch", "--nproc", "2", "--max_restarts", "2", "--master",
                                    f"127.0.0.1:{free_port()}", os.path.join(WORKERS, "refused_toy.py"),
                                    str(tmp_path / "out"), mode],
                          env=ENV, capture_output=True, text=True, timeout=patience(300), cwd=tmp_path, check=False)
    assert done.returncode == code, done.stderr[-3000:]
    assert sorted(launches(tmp_path)) == ["0", "1"], done.stderr[-3000:]  # one launch: each rank started once
    assert "restart 1 of" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert named in last and "no restart can fix it" in last, done.stderr[-3000:]
    assert str(tmp_path / "log") in last  # where the workers' logs are


def test_ptrain_run_with_restarts_refuses_the_layout_with_exit_2_and_no_launch_again(tmp_path):
    done = subprocess.run(PTRAIN + ["run", "digits", "--nproc", "2", "--max_restarts", "2", "--output_dir",
                                    str(tmp_path / "run"), "--tensor_parallel_degree", "3", "--max_steps", "5"],
                          env=ENV, capture_output=True, text=True, timeout=patience(300), cwd=tmp_path, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.count("ptrain: launching:") <= 1 and "restart 1 of" not in done.stderr
    # one line naming the field: on a CPU build the capability check refuses it before the launcher starts (it needs
    # a GPU); where it runs, the layout's own check (3 does not divide the 2 ranks)
    assert re.search(r"tensor_parallel_degree[ =]3", done.stderr.strip().splitlines()[-1]), done.stderr[-3000:]
