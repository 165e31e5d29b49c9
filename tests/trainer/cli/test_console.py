"""The quiet console: ``ptrain run digits`` prints the bar, one line per evaluation and the
summary, nothing else; log lines never tear the bar; known library notices are dropped."""

import io
import logging
import os
import re
import subprocess
import sys
import warnings

import pytest
from helpers import REPO

from trainer import distributed
from trainer.cli import console

EVAL_LINE = re.compile(r"^step=\d+ eval_loss=[\d.e-]+ eval_accuracy=[\d.]+ eval_samples=270 eval_runtime=[\d.e-]+ "
                       r"eval_samples_per_second=[\d.e+-]+ eval_steps_per_second=[\d.e+-]+$")
SUMMARY = re.compile(r"^eval_accuracy=[\d.]+ eval_loss=[\d.]+ test_accuracy=[\d.]+ test_loss=[\d.]+$")


def ptrain(*args, cwd, timeout=600):
    env = {k: v for k, v in os.environ.items() if k not in ("GLOG_minloglevel", "PYTHONWARNINGS", "PADDLE_LOG_LEVEL")}
    return subprocess.run([sys.executable, "-m", "trainer.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=dict(env, PYTHONPATH=REPO))


def ptrain_on_a_terminal(*args, cwd, timeout=600):
    """``ptrain`` with stderr on a pseudo-terminal (the progress bar is drawn only on a terminal); stdout a pipe."""
    import pty

    env = {k: v for k, v in os.environ.items() if k not in ("GLOG_minloglevel", "PYTHONWARNINGS", "PADDLE_LOG_LEVEL")}
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))  # a 160-column terminal
    proc = subprocess.Popen([sys.executable, "-m", "trainer.cli", *args], stdout=subprocess.PIPE, stderr=slave,
                            cwd=cwd, env=dict(env, PYTHONPATH=REPO))
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    stdout = proc.stdout.read().decode()
    proc.wait(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, b"".join(chunks).decode(errors="replace"))


def bar_fragments(stderr: str):
    """What the terminal shows of stderr, split at the bar's carriage returns and at newlines."""
    return [f for f in re.split(r"[\r\n]", stderr) if f.strip()]


def test_digits_demo_prints_bar_eval_lines_and_summary_only(tmp_path):
    out = ptrain_on_a_terminal("run", "digits", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    print(out.stdout + out.stderr)
    lines = out.stdout.splitlines()
    # stdout, whole: 20 evaluation lines (one per epoch), the metrics summary, the run directory
    assert len(lines) == 22, lines
    assert all(EVAL_LINE.match(line) for line in lines[:20]), lines[:20]
    assert [int(line.split()[0][5:]) for line in lines[:20]] == list(range(40, 801, 40))
    assert SUMMARY.match(lines[20]), lines[20]
    assert lines[21] == (f"run directory: {tmp_path / 'runs' / 'digits-demo'} (results.json, metrics.jsonl, "
                         "checkpoints/, inference/, visualdl/)")  # the files the run left
    # stderr, whole: the progress bar and the export's one line (what ptrain serve / predict read), nothing
    # else (no warning, no other INFO line, no banner)
    fragments = bar_fragments(out.stderr)
    export = [f for f in fragments if f.startswith("INFO trainer: exported the inference model to ")]
    assert len(export) == 1 and fragments[-1] == export[0], fragments[-3:]
    bar = fragments[:-1]
    assert bar and all(f.startswith("train:") for f in bar), [f for f in bar if not f.startswith("train:")]
    assert "800/800" in bar[-1]


def test_verbose_shows_what_the_quiet_console_hides(tmp_path):
    out = ptrain("run", "digits", "--max_steps", "120", "--verbose", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "removed old checkpoints" in out.stderr and "LRWarmup: " in out.stderr
    assert "No ccache found" in out.stderr  # paddle's import-time notice, dropped by default


@pytest.fixture
def restore_logging(monkeypatch):
    for name in ("GLOG_minloglevel", "PYTHONWARNINGS", "PADDLE_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {n: logging.getLogger(n).level for n in console.OWN_LOGGERS}
    with warnings.catch_warnings():
        yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, lvl in levels.items():
        logging.getLogger(name).setLevel(lvl)


def test_log_lines_go_through_the_bar_and_noise_is_dropped(restore_logging):
    from tqdm import tqdm

    warnings.simplefilter("always")  # under pytest's own "ignore::UserWarning"; configure() puts its filters first
    console.configure(verbose=False)
    assert os.environ["GLOG_minloglevel"] == "2" and "PADDLE_LOG_LEVEL" not in os.environ  # a launcher flag instead
    stream = io.StringIO()
    handler = next(h for h in logging.getLogger().handlers if isinstance(h, console.BarSafeHandler))
    handler.stream = stream  # not setStream: it flushes the old stream, which may be an earlier test's closed capture
    bar = tqdm(total=10, file=stream, desc="train", ascii=True)
    bar.update(3)
    logging.getLogger("callbacks.checkpoint").info("an INFO line of ours")
    logging.getLogger("paddle.something").info("library INFO: hidden")
    warnings.warn("When training, we now always track global mean and variance.", UserWarning)  # paddle's BN notice
    warnings.warn("something true\nover two lines", UserWarning)
    bar.close()
    shown = [f for f in re.split(r"[\r\n]", stream.getvalue()) if f.strip()]
    ours = [f for f in shown if not f.startswith("train:")]
    assert ours[0] == "INFO callbacks.checkpoint: an INFO line of ours"  # a line of its own, not glued to the bar
    assert re.match(r"^WARNING py\.warnings: UserWarning: something true over two lines \(.*test_console\.py:\d+\)$", ours[1])
    assert len(ours) == 2  # no library INFO, no BatchNorm notice, no bare "warnings.warn(" source line


def test_stderr_to_debug_keeps_banners_for_verbose(restore_logging, caplog):
    with caplog.at_level(logging.DEBUG, logger="trainer.distributed"):
        with distributed.stderr_to_debug("trainer.distributed"):
            sys.stderr.write("=== Modified FLAGS detected ===\n")
    assert "Modified FLAGS detected" in caplog.text
