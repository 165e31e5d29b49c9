"""What tests/conftest.py does before the first test: a disk without room stops the suite in one line, and the
stop signals reach the suite's commands as from a terminal. Real pytest runs in subprocesses."""

import os
import signal
import subprocess
import sys

from helpers import REPO
from patience import patience


def _pytest(tmp_path, *args, env=None, preexec_fn=None):
    (tmp_path / "test_probe.py").write_text(
        "import signal\n\ndef test_probe():\n    print('SIGINT', signal.getsignal(signal.SIGINT) is signal.SIG_IGN,"
        " 'SIGHUP', signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)\n")
    (tmp_path / "conftest.py").write_text(open(os.path.join(REPO, "tests", "conftest.py"), encoding="utf-8").read())
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", "-n", "0",
                           "--basetemp", str(tmp_path / "base"), *args, str(tmp_path / "test_probe.py")],
                          cwd=tmp_path, env=dict({k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
                                                 PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests")]),
                                                 **(env or {})),
                          capture_output=True, text=True, timeout=patience(120), preexec_fn=preexec_fn)


def test_a_disk_without_room_stops_the_suite_before_the_first_test_in_one_line(tmp_path):
    done = _pytest(tmp_path, env={"PTRAIN_TEST_MIN_FREE_GB": "1e9"})
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    assert "test_probe" not in done.stdout and "passed" not in done.stdout
    assert f"GB free in {tmp_path}; the suite needs about 1e+09 GB there" in done.stdout + done.stderr
    assert _pytest(tmp_path).returncode == 0  # the same run with the default need


def test_a_suite_started_with_sigint_and_sighup_ignored_gives_its_commands_the_defaults(tmp_path):
    """``nohup python -m pytest &`` from a script: SIGHUP and SIGINT ignored, and inherited by every ptrain the
    tests start, which keeps them ignored (as it should); conftest puts them back as a terminal's shell would."""
    def ignore():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    done = _pytest(tmp_path, preexec_fn=ignore)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "SIGINT False SIGHUP False" in done.stdout


def test_a_test_that_leaves_a_stop_signal_ignored_or_blocked_is_named_and_the_next_test_gets_the_default(tmp_path):
    (tmp_path / "test_leak.py").write_text(
        "import signal\n\n"
        "def test_a_leaks():\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])\n\n"
        "def test_b_sees():\n    print('TERM ignored', signal.getsignal(signal.SIGTERM) is signal.SIG_IGN,"
        " 'USR1 blocked', signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, []))\n")
    done = _pytest(tmp_path, str(tmp_path / "test_leak.py"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "TERM ignored False USR1 blocked False" in done.stdout
    assert "test_leak.py::test_a_leaks left SIGTERM ignored, SIGUSR1 blocked in the test process (put back)" \
        in " ".join(done.stdout.split())
