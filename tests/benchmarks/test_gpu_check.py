"""benchmarks/gpu_check.py on a machine without a GPU: it says so and exits 0; its launcher worker runs."""

import os
import subprocess
import sys

from helpers import REPO
from patience import patience

from benchmarks import gpu_check

SCRIPT = os.path.join(REPO, "benchmarks", "gpu_check.py")


def test_without_a_gpu_it_says_so_and_exits_cleanly():
    proc = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=patience(120), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "gpu_check: no GPU here" in proc.stdout and "nothing to check" in proc.stdout


def test_card_worker_under_the_real_launcher_on_cpu():
    ranks = gpu_check._launch_cards(None, 2, "cpu")
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert all(r["place"] == "cpu" and r["sum"] == 2.0 and "cpu" in r["after"].lower() for r in ranks)


def test_table_lists_every_row():
    rows = [gpu_check.Row("amp", "PASS", "fp16-O1 0.91", 3.0), gpu_check.Row("nvml", "SKIP", "pynvml missing")]
    text = gpu_check.table(rows)
    assert "amp" in text and "PASS" in text and "SKIP" in text and "pynvml missing" in text
