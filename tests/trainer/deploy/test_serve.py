"""ptrain serve: a real server process on loopback, real HTTP clients, real predictor processes.

A digits MLP is trained for a few steps and exported in the test; a wider
random MLP (slow enough that requests queue) serves the overload, drain and
kill tests. Every server is a ``python -m trainer.cli serve`` subprocess on a
free port (``--port 0``, read from its ready line); every one is stopped and
its predictor processes checked gone.
"""

import concurrent.futures as cf
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from patience import patience
from serving import ROOT, Server, _alive, concurrent_rows, load_clients

from trainer.deploy.predictor import create_predictor, run_predictor


@pytest.fixture(scope="module")
def digits_server(digits_dir):
    # --workers 1: every request through the batcher and the predictor process (by default a lone digits request
    # runs in the server process: test_serve_placement.py)
    server = Server(digits_dir[0], "--workers", "1", "--max_batch_size", "8", "--max_delay_ms", "20",
                    "--max_body_bytes", "200000")
    yield server
    assert server.stop() == 0


# ---- answers -------------------------------------------------------------------------------------
def test_answers_equal_the_predictor_and_ready_health_metrics(digits_server, digits_dir):
    path, x = digits_dir
    (expected,) = run_predictor(create_predictor(path), [x[:3]])
    status, body, _ = digits_server.predict({"inputs": x[:3].tolist()})
    assert status == 200
    np.testing.assert_array_equal(np.asarray(body["outputs"], dtype="float32"), expected)  # the same batch: exact
    assert digits_server.request("GET", "/health")[0] == 200
    status, ready, _ = digits_server.request("GET", "/ready")
    assert status == 200 and ready["inputs"] == [{"name": "input", "shape": [-1, 64], "dtype": "float32"}]
    status, text, headers = digits_server.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert re.search(r'ptrain_serve_requests_total\{model="[^"]+",protocol="v1",status="200"\} [1-9]', text)
    assert "ptrain_serve_batch_size_sum" in text and "ptrain_serve_batch_size_count" in text
    assert "ptrain_serve_queue_depth" in text and "ptrain_serve_request_seconds_bucket" in text


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(digits_server, digits_dir):
    path, x = digits_dir
    predictor = create_predictor(path)
    expected = [run_predictor(predictor, [x[i:i + 1]])[0] for i in range(16)]
    calls, rows = concurrent_rows(digits_server, x[:16], expected)
    assert rows == 16 and calls < 16, (calls, rows)  # 16 requests within 20 ms shared model calls


BAD = [  # (body, status, a piece of the line)
    (b"not json", 400, "the body is not JSON"),
    (b"", 400, "the body is empty"),
    ({"instances": [[0.0] * 64]}, 400, 'the field "inputs" is missing'),
    ([1, 2], 400, "the body must be a JSON object"),
    ({"inputs": [[0.0] * 63]}, 400, "dimension 1 must be 64"),
    ({"inputs": [0.0] * 64}, 400, "1 dimensions, the model takes 2"),
    ({"inputs": [["a"] * 64]}, 400, "got strings"),
    ({"inputs": [[0.0] * 64, [0.0] * 3]}, 400, "ragged"),
    ({"inputs": []}, 400, "the batch is empty"),
    ({"inputs": 3}, 400, "expected a list of instances"),
    ({"inputs": {"x": [[0.0] * 64]}}, 400, "the model takes inputs ['input']"),
    ({"inputs": [[0.0] * 64] * 9}, 400, "at most 8 (--max_batch_size)"),
    (b'{"inputs": "\xc3\x28"}', 400, "not UTF-8 JSON"),
    (b"[" * 100000 + b"]" * 100000, 400, "the body must be a JSON object"),  # orjson reads it
    (b"[" * 10000 + b"NaN" + b"]" * 10000, 400, "nested too deeply"),  # json (orjson refuses NaN) cannot
    (b'{"inputs": [[Infinity' + b", 0" * 63 + b"]]}", 400, "value at [0, 0] is Infinity"),
    (b'{"inputs": [[0, -Infinity' + b", 0" * 62 + b"]]}", 400, "value at [0, 1] is -Infinity"),
    (b'{"inputs": [[1e309' + b", 0" * 63 + b"]]}", 400, "value at [0, 0] is Infinity"),
    (b'{"inputs": [[0, 0, 1e39' + b", 0" * 61 + b"]]}", 400, "value at [0, 2] is Infinity (or beyond float32's range)"),
    (b'{"inputs": [[0, NaN' + b", 0" * 62 + b"]]}", 400,
     "value at [0, 1] is NaN: send finite numbers (ptrain serve --allow_nonfinite"),
    # booleans are not numbers (v2 refuses them too): once read as 1.0 (issue 40)
    ({"inputs": [[True] * 64]}, 400, "inputs: expected [N, 64] of numbers, got true/false"),
    ({"inputs": {"input": [[False] * 64]}}, 400, "inputs.input: expected [N, 64] of numbers, got true/false"),
    ({"inputs": [[0.5] * 63 + [True]]}, 400, "inputs: expected [N, 64] of numbers, got true/false"),  # numpy: 1.0
]


@pytest.mark.parametrize("body,status,line", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_requests_get_400_with_one_line(digits_server, body, status, line):
    got, answer, _ = digits_server.predict(body)
    assert got == status and line in answer["error"], answer
    assert "\n" not in answer["error"]


def test_limits_and_unknown_paths(digits_server):
    status, answer, _ = digits_server.predict(b"[" + b"0," * 150000 + b"0]")
    assert status == 413 and "--max_body_bytes" in answer["error"]
    assert digits_server.request("GET", "/v1/predict")[0] == 405
    assert digits_server.request("GET", "/nope")[0] == 404
    assert digits_server.request("GET", "/health")[0] == 200  # nothing above hurt the server


def test_cli_errors_name_the_flag(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = lambda *a: subprocess.run([sys.executable, "-m", "trainer.cli", "serve", *a], capture_output=True,
                                    text=True, env=env, cwd=ROOT, timeout=patience(120))
    r = run(str(tmp_path / "missing"))
    assert r.returncode == 2 and "MODEL_DIR" in r.stderr and "does not exist" in r.stderr
    r = run(str(tmp_path))
    assert r.returncode == 3 and "holds no inference model" in r.stderr
    r = run(str(tmp_path), "--max_batch_size", "0")
    assert r.returncode == 2 and "--max_batch_size 0" in r.stderr


def test_a_port_in_use_is_exit_2_naming_it(digits_dir):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "trainer.cli", "serve", digits_dir[0], "--port", str(port)],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT, timeout=patience(120))
    assert r.returncode == 2 and f"--port {port}: cannot listen there (Address already in use)" in r.stderr


def test_a_model_that_cannot_load_exits_3_with_the_line(digits_dir, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(digits_dir[0], broken)
    (broken / "model.pdiparams").write_bytes(b"not parameters")
    r = subprocess.run([sys.executable, "-m", "trainer.cli", "serve", str(broken), "--port", "0"], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT, timeout=patience(120))
    assert r.returncode == 3, r.stderr[-2000:]
    assert "the predictor process could not load the model:" in r.stderr and "ready on" not in r.stdout


# ---- load, lifetime ------------------------------------------------------------------------------
def test_a_full_queue_answers_503_with_retry_after(slow_dir):
    server = Server(slow_dir, "--max_batch_size", "1", "--max_queue", "2", "--max_delay_ms", "0")
    try:
        row = {"inputs": [[0.5] * 64]}
        with cf.ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(lambda _: server.predict(row), range(48)))
        codes = [a[0] for a in answers]
        assert set(codes) <= {200, 503} and 503 in codes and 200 in codes, codes
        refused = next(a for a in answers if a[0] == 503)
        assert refused[2]["retry-after"] == "1" and "--max_queue 2" in refused[1]["error"]
        assert server.predict(row)[0] == 200
    finally:
        assert server.stop() == 0


def test_sigterm_drains_accepted_requests_and_exits_0(slow_dir):
    server = Server(slow_dir, "--max_batch_size", "4", "--max_delay_ms", "2")
    results, stop, threads = load_clients(server, 12, {"inputs": [[0.1] * 64] * 2})
    deadline = time.monotonic() + patience(60)  # the signal lands under load: some requests answered first
    while results.count(200) < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    before = len(results)
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(patience(30))
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join(30)
    assert code == 0, server.err
    m = re.search(r"(\d+) requests accepted, (\d+) answered, (\d+) refused while draining", server.err)
    assert m, server.err
    accepted, answered = int(m.group(1)), int(m.group(2))
    assert accepted == answered == results.count(200) and before > 0
    after = results[before:]
    assert "ConnectionRefusedError" in after  # nobody listens once it stopped
    # a 503 while draining, a refused connection once it stopped, never a reset: the backlog is taken and sealed
    # before the socket closes, and answered after (connections.refuse_backlog)
    assert set(results) <= {200, 503, "ConnectionRefusedError"}, set(results)
    server.stop()


def test_a_killed_predictor_process_is_restarted_and_its_requests_get_500(slow_dir):
    server = Server(slow_dir, "--max_batch_size", "1", "--max_delay_ms", "0")
    try:
        results, stop = [], threading.Event()

        def client():
            while not stop.is_set():
                results.append(server.predict({"inputs": [[0.2] * 64]}, timeout=patience(60)))

        threads = [threading.Thread(target=client) for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        os.kill(server.pids[0], signal.SIGKILL)
        deadline = time.monotonic() + patience(60)
        while time.monotonic() < deadline and "is ready" not in server.err.split("killed by SIGKILL")[-1]:
            time.sleep(0.1)
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(60)
        failed = [r for r in results if r[0] == 500]
        assert failed and all("killed by SIGKILL" in r[1]["error"] for r in failed), [r[:2] for r in results[-5:]]
        assert set(r[0] for r in results) <= {200, 500}
        assert server.predict({"inputs": [[0.2] * 64]})[0] == 200  # the new process answers
        assert "ptrain_serve_worker_restarts_total 1.0" in server.request("GET", "/metrics")[1]
        assert not _alive(server.pids[0])
        server.pids = [int(p) for p in re.findall(r"predictor process 0 \(pid (\d+)\) is ready", server.err)]
    finally:
        assert server.stop() == 0


def test_predictor_processes_die_with_a_killed_server(digits_dir):
    server = Server(digits_dir[0], "--workers", "2")
    assert len(server.pids) == 2 and all(_alive(p) for p in server.pids)
    server.proc.kill()  # SIGKILL: no drain, no cleanup code runs in the server
    server.proc.wait(10)
    deadline = time.monotonic() + patience(10)
    while any(_alive(p) for p in server.pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in server.pids), "a predictor process outlived its server"


# ---- ONNX ----------------------------------------------------------------------------------------
def test_onnx_export_matches_and_serves(digits_dir, tmp_path):
    pytest.importorskip("onnxruntime", reason="the onnx extra is not installed: pip install -e '.[onnx]'")
    pytest.importorskip("paddle2onnx", reason="the onnx extra is not installed: pip install -e '.[onnx]'")
    import shutil

    from trainer.deploy.onnx_export import export_onnx

    path = str(tmp_path / "inference")
    shutil.copytree(digits_dir[0], path)
    report = export_onnx(path)
    assert report["max_abs_diff"] <= 1e-4 and os.path.isfile(os.path.join(path, "model.onnx"))
    x = digits_dir[1][:4]
    (expected,) = run_predictor(create_predictor(path), [x])
    server = Server(path, "--runtime", "onnxruntime")
    try:
        status, body, _ = server.predict({"inputs": x.tolist()})
        assert status == 200
        np.testing.assert_allclose(np.asarray(body["outputs"], dtype="float32"), expected, atol=1e-4, rtol=0)
    finally:
        assert server.stop() == 0


def test_a_sigterm_to_the_whole_process_group_drains_as_one_to_the_server(slow_dir):
    """systemd's stop (KillMode=control-group), ``kill -TERM -PGID``, a terminal's Ctrl-C: the predictor processes
    get the signal too. They leave stopping to the server (paddle's model loader installs its own SIGTERM/SIGINT
    handlers: the predictor ignores both again once its model is loaded), so the server drains and exits 0 and no
    predictor is reported killed or started again."""
    server = Server(slow_dir, "--max_batch_size", "4", "--max_delay_ms", "2", preexec_fn=os.setsid)
    assert server.predict({"inputs": [[0.1] * 64] * 2})[0] == 200
    os.killpg(server.proc.pid, signal.SIGTERM)
    code = server.proc.wait(patience(30))
    assert code == 0, server.err
    assert "killed by" not in server.err and "starting a new one" not in server.err, server.err
    assert re.search(r"\d+ requests accepted, \d+ answered", server.err), server.err
    server.stop()
