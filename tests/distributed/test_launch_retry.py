"""The tests' launcher (tests/helpers.py ``run_launch``) runs a launch again only for paddle's own failures: a
rank that dies of a signal with nothing in its log is launched again; one that fails with a report (a Python
traceback, paddle's signal summary) is returned at once. Real launches of a script that crashes on its first
attempt only (a marker file says which attempt it is)."""

import os
import sys

from helpers import free_port, run_launch

SCRIPT = '''
import os, signal, sys
marker = sys.argv[1]
rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
first = not os.path.exists(marker)
if rank == 0 and first:
    open(marker, "w").close()
    if sys.argv[2] == "silent":
        signal.signal(signal.SIGABRT, signal.SIG_DFL)  # paddle is not imported: nothing reports the signal
        os.kill(os.getpid(), signal.SIGABRT)
    raise RuntimeError("a failure of the code under test")
print("attempt done", rank, flush=True)
'''


def _launch(tmp_path, how):
    script = tmp_path / "crash_once.py"
    script.write_text(SCRIPT)
    log_dir = tmp_path / "logs"
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--master",
           f"127.0.0.1:{free_port()}", "--log_dir", str(log_dir), str(script), str(tmp_path / "marker"), how]
    return run_launch(cmd, str(log_dir), dict(os.environ), timeout=120, cwd=str(tmp_path)), log_dir


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
