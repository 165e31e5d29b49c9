"""The tests' launcher (tests/helpers.py ``run_launch``) runs a launch again only for paddle's own failures: a
rank that dies of a signal with nothing in its log is launched again; one that fails with a report (a Python
traceback, paddle's signal summary) is returned at once, and ``before_retry`` clears what a dead attempt left.
Real launches of a script that crashes on its first attempt only (a marker file says which attempt it is)."""

import os
import shutil
import sys

from helpers import free_port, run_launch

SCRIPT = '''
import os, signal, sys
marker = sys.argv[1]
rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
first = not os.path.exists(marker)
if sys.argv[2] == "late":  # the run's output first, as a run that saves and then dies at its exit
    out = os.path.join(os.path.dirname(marker), "out", f"rank{rank}")
    if os.path.exists(out):
        raise RuntimeError("the output of an earlier run is there")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    open(out, "w").close()
if rank == 0 and first:
    open(marker, "w").close()
    if sys.argv[2] in ("silent", "late"):
        signal.signal(signal.SIGABRT, signal.SIG_DFL)  # paddle is not imported: nothing reports the signal
        os.kill(os.getpid(), signal.SIGABRT)
    raise RuntimeError("a failure of the code under test")
print("attempt done", rank, flush=True)
'''


def _launch(tmp_path, how, before_retry=None):
    script = tmp_path / "crash_once.py"
    script.write_text(SCRIPT)
    log_dir = tmp_path / "logs"
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--master",
           f"127.0.0.1:{free_port()}", "--log_dir", str(log_dir), str(script), str(tmp_path / "marker"), how]
    return run_launch(cmd, str(log_dir), dict(os.environ), timeout=120, cwd=str(tmp_path),
                      before_retry=before_retry), log_dir


def test_a_silent_death_by_signal_is_launched_again(tmp_path, capfd):
    proc, log_dir = _launch(tmp_path, "silent")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "a rank died of a signal inside paddle with nothing in its log (attempt 1)" in capfd.readouterr().err
    assert (tmp_path / "logs.raced-1" / "workerlog.0").read_text() == ""  # the first attempt's logs, kept
    assert "attempt done 0" in (log_dir / "workerlog.0").read_text()


def test_a_failure_that_says_why_is_not_launched_again(tmp_path, capfd):
    proc, log_dir = _launch(tmp_path, "traceback")
    assert proc.returncode != 0
    assert "RuntimeError: a failure of the code under test" in (log_dir / "workerlog.0").read_text()
    assert "launching again" not in capfd.readouterr().err and not (tmp_path / "logs.raced-1").exists()


def test_a_silent_death_after_the_output_was_written_is_launched_again_on_a_cleared_output(tmp_path):
    """A rank that dies at exit leaves the run's output behind: launched again on it, the run refuses to start
    (as the Trainer refuses an output_dir with checkpoints); ``before_retry`` clears it first."""
    bare, cleared = tmp_path / "bare", tmp_path / "cleared"
    bare.mkdir()
    cleared.mkdir()
    proc, log_dir = _launch(bare, "late")
    assert proc.returncode != 0 and "the output of an earlier run is there" in (log_dir / "workerlog.0").read_text()
    proc, log_dir = _launch(cleared, "late", before_retry=lambda: shutil.rmtree(cleared / "out"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "attempt done 0" in (log_dir / "workerlog.0").read_text() and (cleared / "logs.raced-1").is_dir()
