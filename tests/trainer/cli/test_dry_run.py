"""``ptrain run TASK --dry_run`` writes nothing: before, the Trainer it builds to describe the run made the
output_dir (PaddleNLP's Trainer does, at construction) and ``ptrain run ernie --dry_run`` left an empty
``runs/ernie-demo/`` (and ``runs/``) behind."""

import os
import subprocess
import sys

from helpers import REPO
from patience import patience

from trainer.cli.tasks import available_tasks


def test_a_dry_run_of_every_task_leaves_the_working_directory_as_it_was(tmp_path):
    tasks = sorted({ep.value: name for name, ep in available_tasks().items()}.values())  # one name per task
    assert {"digits", "ernie"} <= set(tasks) and len(tasks) >= 3, tasks
    # every task's dry run in one process (one paddle import), as ptrain runs it, from an empty directory
    code = ("import sys; from trainer.cli.commands import main\n"
            "sys.exit(max(main(['run', t, '--dry_run']) for t in sys.argv[1:]))\n")
    (tmp_path / "cwd").mkdir()
    out = subprocess.run([sys.executable, "-c", code, *tasks], capture_output=True, text=True, cwd=tmp_path / "cwd",
                         env=dict(os.environ, PYTHONPATH=REPO), timeout=patience(300))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("callbacks (order, name):") == len(tasks), out.stdout[-2000:]
    assert os.listdir(tmp_path / "cwd") == []


def test_a_dry_run_keeps_an_output_dir_that_was_there(tmp_path):
    (tmp_path / "mine").mkdir()
    code = "import sys; from trainer.cli.commands import main; sys.exit(main(sys.argv[1:]))"
    out = subprocess.run([sys.executable, "-c", code, "run", "digits", "--dry_run", "--output_dir", "mine/run"],
                         capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=REPO),
                         timeout=patience(240))
    assert out.returncode == 0, out.stderr[-3000:]
    assert os.listdir(tmp_path) == ["mine"] and os.listdir(tmp_path / "mine") == []


def test_a_dry_run_says_at_once_that_the_run_would_be_refused(tmp_path):
    """An output_dir holding an earlier run's checkpoints: the run itself is refused in one line, exit 2; its dry
    run says so too (before: it printed the arguments and exited 0), and with --resume_from_checkpoint auto it
    does not. The dry run still writes nothing."""
    code = "import sys; from trainer.cli.commands import main; sys.exit(main(sys.argv[1:]))"

    def ptrain(*argv):
        return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=tmp_path,
                              env=dict(os.environ, PYTHONPATH=REPO), timeout=patience(300))

    first = ptrain("run", "digits", "--output_dir", "out", "--max_steps", "4", "--save_steps", "2",
                   "--evaluation_strategy", "no")
    assert first.returncode == 0, first.stderr[-3000:]
    before = sorted(os.listdir(tmp_path / "out" / "checkpoints"))
    real = ptrain("run", "digits", "--output_dir", "out", "--max_steps", "4")
    dry = ptrain("run", "digits", "--output_dir", "out", "--dry_run")
    assert real.returncode == dry.returncode == 2, (real.stderr[-2000:], dry.stderr[-2000:])
    refusal = "output_dir out holds checkpoints of an earlier run (newest step-4)"
    assert refusal in real.stderr and f"ptrain: the run would be refused: {refusal}" in dry.stderr, dry.stderr[-2000:]
    assert "callbacks (order, name):" in dry.stdout  # the dry run's report comes first, as always
    resumed = ptrain("run", "digits", "--output_dir", "out", "--dry_run", "--resume_from_checkpoint", "auto")
    assert resumed.returncode == 0 and "would be refused" not in resumed.stderr, resumed.stderr[-2000:]
    assert sorted(os.listdir(tmp_path / "out" / "checkpoints")) == before
