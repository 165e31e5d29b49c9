"""A user's mistake under ``ptrain launch`` is one line. Before: float class labels on 2 ranks printed
41 lines, the DataError four times (each rank's traceback, the launcher's echo of rank 1's log, ptrain's
per-rank lines and its summary). After: each rank writes its traceback to ``LOG_DIR/rank-N.traceback``
instead of the console and exits with the error's code; ptrain prints ranks that failed alike in one line."""

import os
import subprocess
import sys

from helpers import REPO, free_port

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "float_labels_toy.py")


def test_float_labels_on_two_ranks_are_one_line_and_exit_3(tmp_path):
    logs = tmp_path / "logs"
    done = subprocess.run([sys.executable, "-m", "trainer.cli", "launch", "--nproc", "2", "--master",
                           f"127.0.0.1:{free_port()}", "--log_dir", str(logs), WORKER, str(tmp_path / "out")],
                          env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    text = done.stdout + done.stderr
    assert done.returncode == 3, text[-3000:]
    assert text.count("labels are float32 but CrossEntropyLoss takes class indices") == 1, text
    (line,) = [x for x in text.splitlines() if "float32" in x]
    assert line.startswith("ptrain: ranks 0, 1 failed (exit 3): DataError: labels are float32") and str(logs) in line
    assert "Traceback" not in text and len(text.strip().splitlines()) <= 8, text
    for rank in (0, 1):  # the tracebacks are kept, off the console
        assert "DataError" in (logs / f"rank-{rank}.traceback").read_text()
