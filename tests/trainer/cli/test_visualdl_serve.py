"""``ptrain visualdl``: VisualDL's real server on a real run's logdir answers a plain HTTP
client (urllib, no Accept-Language header), which plain ``visualdl`` 2.5.3 answers with HTTP 500."""

import doctest
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from helpers import REPO, free_port
from patience import patience

import trainer.cli.visualdl_serve


def get(url, language=None, timeout=30):
    request = urllib.request.Request(url, headers={"Accept-Language": language} if language else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A folder holding a finished digits run, ``run/``."""
    tmp_path = tmp_path_factory.mktemp("visualdl")
    run = subprocess.run([sys.executable, "-m", "trainer.cli", "run", "digits", "--max_steps", "20", "--output_dir",
                          "run", "--disable_tqdm", "true"], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=REPO),
                         capture_output=True, text=True, timeout=patience(300))
    assert run.returncode == 0, run.stderr[-2000:]
    return tmp_path


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_pages_and_api_answer_without_accept_language(trained, sig):
    """Every page answers whatever the request's language; SIGTERM (a kill, a supervisor) or SIGINT (Ctrl-C: visualdl
    resets SIGINT to its default when it builds its app, which used to end it without a word) stop it with one line."""
    tmp_path, env = trained, dict(os.environ, PYTHONPATH=REPO)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "trainer.cli", "visualdl", "--logdir", "run", "--host",
                               "127.0.0.1", "--port", str(port)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + patience(180)  # a busy machine imports paddle and visualdl slowly
        while True:
            try:
                if get(base + "/alive", timeout=patience(5))[0] == 204:
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            assert server.poll() is None and time.time() < deadline, "the VisualDL server did not start"
            time.sleep(0.5)
        for path in ("/", "/app/index", "/app/scalar"):
            status, body = get(base + path)
            assert status == 200 and "<html" in body.lower(), (path, status)
        assert get(base + "/app/index", "fr-FR")[0] == 200  # a language visualdl lacks falls back too
        assert get(base + "/app/index", "zh-CN,zh;q=0.9")[0] == 200
        status, body = get(base + "/app/api/scalar/tags")
        assert status == 200 and "train/loss" in body
        server.send_signal(sig)
        output = server.communicate(timeout=patience(60))[0]
        name, code = signal.Signals(sig).name, 128 + sig
        assert server.returncode == code, output[-2000:]
        assert output.strip().splitlines()[-1] == f"ptrain visualdl: stopped by {name}, server closed (exit {code})"
        assert "outside training" not in output
    finally:
        server.terminate()
        try:
            server.wait(timeout=patience(30))
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_docstring_examples_run():
    result = doctest.testmod(trainer.cli.visualdl_serve)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("flags, says", [
    (["--logdir", "runs/typo"], "--logdir runs/typo: not a folder"),
    (["--logdir=runs/typo"], "--logdir runs/typo: not a folder"),
    (["--logdir", "runs", "runs/typo"], "--logdir runs/typo: not a folder"),
    (["--logdir=runs", "--logdir", "runs"], "--logdir is given more than once (visualdl keeps only the last)")],
    ids=["one", "equals", "second-of-two", "twice"])
def test_a_logdir_missing_or_given_twice_is_refused_in_one_line(tmp_path, flags, says):
    """visualdl itself serves an empty board for a folder that is not there (a typo looks like a run with no
    records): refused, one line naming it, exit 2, no server. The folders as visualdl's own parser reads them."""
    (tmp_path / "runs").mkdir()
    done = subprocess.run([sys.executable, "-m", "trainer.cli", "visualdl", *flags, "--port",
                           str(free_port())], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True,
                          text=True, timeout=patience(120))
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith(f"ptrain: error: {says}")
