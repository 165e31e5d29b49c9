"""Where ``ptrain serve`` runs requests by default (``trainer.deploy.placement``): for the digits MLP, whose call is far
under ``--inline_max_ms``, a lone request in the server process (answered even while the predictor process is dead)
and requests under load batched in the predictor process; an 8.5 M-parameter MLP only in its predictor process, as
digits with ``--inline_max_ms 0``. Real servers, real answers."""

import os
import re
import signal
import time

import numpy as np
from patience import patience
from serving import Server, batch_stats, concurrent_rows, load_clients

from trainer.deploy.placement import runs_inline
from trainer.deploy.predictor import create_predictor, run_predictor


def test_only_a_default_cpu_model_under_the_bound_moves():
    assert runs_inline(0.05, None, "cpu", 1.0)
    assert not runs_inline(3.0, None, "cpu", 1.0)       # slower than the bound
    assert not runs_inline(0.05, 1, "cpu", 1.0)         # --workers given: kept as asked
    assert not runs_inline(0.05, None, "gpu:0", 1.0)    # a GPU model stays in its process
    assert not runs_inline(None, None, "cpu", 1.0)      # not measured (inputs of unknown shape)
    assert not runs_inline(0.05, None, "cpu", 0.0)      # --inline_max_ms 0: never


def test_the_default_runs_lone_digits_requests_in_the_server_process_and_batches_the_rest(digits_dir):
    path, x = digits_dir
    predictor = create_predictor(path)
    (expected,) = run_predictor(predictor, [x[:3]])
    server = Server(path, "--max_delay_ms", "20")
    try:
        assert len(server.pids) == 1 and server.pids != [server.proc.pid], server.err  # its predictor process
        line = "a lone request runs in the server process (its call on a full batch takes"
        assert line in server.err_with(line)
        status, body, _ = server.predict({"inputs": x[:3].tolist()})
        assert status == 200
        np.testing.assert_array_equal(np.asarray(body["outputs"], dtype="float32"), expected)
        name = server_model(server)
        v2 = {"inputs": [{"name": "input", "shape": [3, 64], "datatype": "FP32", "data": x[:3].ravel().tolist()}]}
        for model in (name, f"{name}/versions/1"):  # every infer path (they skip Starlette's router: http_app)
            status, body, _ = server.infer(model, v2)
            assert status == 200
            np.testing.assert_array_equal(np.asarray(body["outputs"][0]["data"], "float32").reshape(3, 10), expected)
        status, body, _ = server.request("POST", f"/v1/models/{name}/predict", {"inputs": x[:3].tolist()})
        assert status == 200
        np.testing.assert_array_equal(np.asarray(body["outputs"], dtype="float32"), expected)
        assert server.infer(f"{name}/versions/2", v2)[0] == 404 and server.infer("nope", v2)[0] == 404
        assert server.request("POST", f"/v2/models/{name}/ready")[0] == 405  # not an infer path: the router's answer

        # under load, requests batch in the predictor process (a burst read one request at a time could run each
        # alone in the server process: 16 clients for 2 s keep requests waiting)
        alone = [run_predictor(predictor, [x[i:i + 1]])[0] for i in range(16)]
        assert concurrent_rows(server, x[:16], alone)[1] == 16  # every answer its own rows
        before = batch_stats(server)
        results, stop, threads = load_clients(server, 16, {"inputs": x[:1].tolist()}, pause=0.005)
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(30)
        after = batch_stats(server)
        calls, rows = after[0] - before[0], after[1] - before[1]
        assert set(results) == {200} and calls < rows, (calls, rows, set(results))  # shared model calls

        # a lone request while the predictor process is dead: answered in the server process, not queued for it
        time.sleep(0.5)  # quiet: the last model call ended over 50 ms + --max_delay_ms ago (batching.IDLE_AFTER)
        os.kill(server.pids[0], signal.SIGKILL)
        assert _wait(lambda: "starting a new one" in server.err)
        status, body, _ = server.predict({"inputs": x[:3].tolist()})
        assert status == 200 and "is ready" not in server.err.split("starting a new one")[-1], server.err[-1500:]
        np.testing.assert_array_equal(np.asarray(body["outputs"], dtype="float32"), expected)
        assert _wait(lambda: "is ready" in server.err.split("starting a new one")[-1])
        server.pids = [int(p) for p in re.findall(r"predictor process 0 \(pid (\d+)\) is ready", server.err)]
    finally:
        assert server.stop() == 0


def test_a_slower_model_and_the_flags_keep_a_predictor_process(digits_dir, slow_dir):
    for path, flags in ((slow_dir, ()), (digits_dir[0], ("--inline_max_ms", "0"))):
        server = Server(path, *flags)
        try:
            assert len(server.pids) == 1 and server.pids != [server.proc.pid], (flags, server.pids)
            line = "runs in its predictor process: its call on a full batch takes"
            err = server.err_with(line, timeout=10 if not flags else 1)
            assert "runs in the server process" not in err
            assert (line in err) == (not flags)
            assert server.predict({"inputs": [[0.5] * 64]})[0] == 200
        finally:
            assert server.stop() == 0


def server_model(server):
    return server.request("GET", "/ready")[1]["models"].popitem()[0]


def _wait(predicate, timeout=60.0):
    deadline = time.monotonic() + patience(timeout)
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False
