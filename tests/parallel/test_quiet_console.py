"""A quiet console under every layout (issue 39 item 7): a ``ptrain run`` on 2 processes prints only the
project's own lines; paddle's and fleet's INFO lines and warnings go to ``paddle.RANK.log`` beside the workers'
logs, and ``--verbose`` shows them. Real runs of the digits task through paddle's launcher (gloo). The shimmed
tensor-parallel run is judged the same way in tests/models/test_ernie_tensor_parallel.py."""

import os
import subprocess
import sys

import pytest
from helpers import REPO, free_port
from parallel.quiet import foreign_lines
from patience import patience

SMALL = ["--max_steps", "4", "--logging_steps", "2", "--disable_tqdm", "true", "--save_strategy", "no"]


def run(tmp_path, *flags):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "trainer.cli", "run", "digits", "--nproc", "2", "--master",
                           f"127.0.0.1:{free_port()}", "--output_dir", str(out), *SMALL, *flags], cwd=tmp_path,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO), timeout=patience(300))
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done


@pytest.mark.parametrize("layout", [[], ["--sharding", "stage1", "--recompute", "true", "--recompute_modules", "Linear"]], ids=["dp", "stage1+recompute"])
def test_the_console_holds_only_our_lines(tmp_path, layout):
    out, done = run(tmp_path, *layout)
    assert foreign_lines(done.stdout, done.stderr) == [], done.stdout + done.stderr
    assert "run directory:" in done.stdout  # (the run did print)
    if layout:  # fleet's lines are in the log files: its topology and sharding optimizer, paddle's warnings
        logged = (out / "launch_logs" / "paddle.0.log").read_text()
        assert "paddle.distributed.fleet" in logged and "py.warnings" in logged


def test_verbose_shows_paddles_lines(tmp_path):
    out, done = run(tmp_path, "--sharding", "stage1", "--verbose")
    assert any("paddle.distributed.fleet" in line for line in foreign_lines(done.stdout, done.stderr)), done.stdout
