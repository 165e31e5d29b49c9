"""The Open Inference Protocol over gRPC (``--grpc_port``), spoken by tritonclient's gRPC client, unchanged, and by a
plain grpc stub of the published service (typed ``contents``), against a real server process: answers bitwise equal
to the HTTP v2 answer and to paddle.inference, errors with their status codes and HTTP's one-line messages.

The clients run in a child process: tritonclient.grpc's compiled ``model_config.proto`` and VisualDL's copy of it
(imported by ``ptrain visualdl --help`` in tests/docs) cannot both load into one process's protobuf pool."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from patience import patience
from serving import Server, batch_stats

from helpers import REPO
from trainer.deploy.predictor import create_predictor, run_predictor

pytest.importorskip("grpc", reason="the serve and test extras install grpcio")

PRELUDE = """
import json, sys
import numpy as np
import grpc
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

address, x = sys.argv[1], np.load(sys.argv[2])
client = grpcclient.InferenceServerClient(address)
out = {}

def err(call):
    try:
        call()
    except InferenceServerException as exc:
        return [exc.status(), exc.message()]
    except grpc.RpcError as exc:
        return [str(exc.code()), exc.details()]
    return None

def array(a):
    return {"dtype": str(a.dtype), "shape": list(a.shape), "hex": a.tobytes().hex()}

def infer_input(a, datatype="FP32"):
    inp = grpcclient.InferInput("input", list(a.shape), datatype)
    inp.set_data_from_numpy(a)
    return inp
"""


def _grpc(port, x, body, tmp_path):
    """Run ``body`` (client code that fills ``out``) in a child process against ``127.0.0.1:port``; ``out``."""
    np.save(tmp_path / "x.npy", x)
    script = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    run = subprocess.run([sys.executable, "-c", script, f"127.0.0.1:{port}", str(tmp_path / "x.npy")], check=False,
                         capture_output=True, text=True, cwd=REPO, timeout=patience(120))
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _while_clients_call(port, script, tmp_path, action):
    """Start the client ``script`` (x at ``tmp_path/x.npy``), wait for its "going" line, run ``action()``, then its
    ``out``."""
    child = subprocess.Popen([sys.executable, "-c", script, f"127.0.0.1:{port}", str(tmp_path / "x.npy")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert child.stdout.readline().strip() == "going", child.stderr.read()[-3000:]
        action()
        stdout, stderr = child.communicate(timeout=patience(180))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def _array(entry):
    return np.frombuffer(bytes.fromhex(entry["hex"]), entry["dtype"]).reshape(entry["shape"])


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(digits_dir, *flags):
    port = _free_port()
    server = Server(digits_dir[0], "--workers", "1", "--model_name", "digits", "--output_names", "logits",
                    "--max_batch_size", "8", "--max_delay_ms", "20", "--grpc_port", str(port), *flags)
    assert f"gRPC on 127.0.0.1:{port}" in server.ready_line
    return server, port


@pytest.fixture(scope="module")
def served(digits_dir):
    server, port = _start(digits_dir)
    yield server, port
    assert server.stop() == 0


def test_probes_metadata_and_infer_through_tritonclient_grpc(served, digits_dir, tmp_path):
    server, port = served
    path, x = digits_dir
    out = _grpc(port, x, """
        out["live"], out["ready"] = client.is_server_live(), client.is_server_ready()
        out["model_ready"] = [client.is_model_ready("digits"), client.is_model_ready("digits", "1")]
        out["server"] = client.get_server_metadata(as_json=True)
        out["model"] = client.get_model_metadata("digits", as_json=True)
        result = client.infer("digits", [infer_input(x[:3])], outputs=[grpcclient.InferRequestedOutput("logits")],
                              request_id="g-7")
        response = result.get_response()
        out["logits"] = array(result.as_numpy("logits"))
        out["head"] = [response.model_name, response.model_version, response.id, len(response.raw_output_contents)]
        out["all_outputs"] = array(client.infer("digits", [infer_input(x[:3])], model_version="1").as_numpy("logits"))
    """, tmp_path)
    assert out["live"] is True and out["ready"] is True and out["model_ready"] == [True, True]
    assert out["server"]["name"] == "ptrain-serve" and "binary_tensor_data" in out["server"]["extensions"]
    model = out["model"]
    assert model["name"] == "digits" and model["versions"] == ["1"] and model["platform"] == "paddle_inference"
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "64"]}]
    assert model["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": ["-1", "10"]}]
    assert out["head"] == ["digits", "1", "g-7", 1]
    got = _array(out["logits"])
    assert got.dtype == np.float32 and got.shape == (3, 10)
    (expected,) = run_predictor(create_predictor(path), [x[:3]])
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(_array(out["all_outputs"]), expected)  # no outputs asked: every output
    status, answer, _ = server.infer("digits", {"inputs": [{"name": "input", "shape": [3, 64], "datatype": "FP32",
                                                            "data": x[:3].ravel().tolist()}]})
    assert status == 200
    assert got.tobytes() == np.asarray(answer["outputs"][0]["data"], "float32").reshape(3, 10).tobytes()


def test_typed_contents_through_a_plain_stub(served, digits_dir, tmp_path):
    path, x = digits_dir
    out = _grpc(served[1], x, """
        with grpc.insecure_channel(address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = service_pb2.ModelInferRequest(model_name="digits")
            tensor = request.inputs.add(name="input", datatype="FP32", shape=[2, 64])
            tensor.contents.fp32_contents.extend(x[4:6].ravel().tolist())
            answer = stub.ModelInfer(request, timeout=120)
            out["names"] = [o.name for o in answer.outputs]
            out["shape"] = list(answer.outputs[0].shape)
            out["logits"] = array(np.frombuffer(answer.raw_output_contents[0], "<f4").reshape(2, 10))
            request.inputs[0].datatype = "INT64"  # int64_contents is empty: 0 values for 128
            out["empty"] = err(lambda: stub.ModelInfer(request, timeout=120))
    """, tmp_path)
    (expected,) = run_predictor(create_predictor(path), [x[4:6]])
    assert out["names"] == ["logits"] and out["shape"] == [2, 10]
    np.testing.assert_array_equal(_array(out["logits"]), expected)
    code, line = out["empty"]
    assert code == "StatusCode.INVALID_ARGUMENT" and "has 0 values, shape [2, 64] needs 128" in line


SHAPES = [[1] * 99 + [64], [1] * 64 + [64], [0, 2 ** 62, 2 ** 62], [1, 2 ** 62], [2 ** 62, 64], [0, 64], [1, 0]]


def test_malformed_shapes_are_invalid_argument_with_https_line(served, digits_dir, tmp_path):
    """Shapes numpy cannot make (100 dimensions: once UNKNOWN and a traceback, issue 40) or only by allocating
    10**18 values: INVALID_ARGUMENT with the line HTTP v2 answers 400 for the same tensor, nothing logged."""
    out = _grpc(served[1], digits_dir[1], f"""
        with grpc.insecure_channel(address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            out["codes"] = []
            for shape in {SHAPES!r}:
                request = service_pb2.ModelInferRequest(model_name="digits")
                request.inputs.add(name="input", datatype="FP32", shape=shape)
                request.raw_input_contents.append(x[:1].tobytes())
                out["codes"].append(err(lambda: stub.ModelInfer(request, timeout=120)))
    """, tmp_path)
    for shape, (code, line) in zip(SHAPES, out["codes"]):
        head = json.dumps({"inputs": [{"name": "input", "shape": shape, "datatype": "FP32",
                                       "parameters": {"binary_data_size": 256}}]}).encode()
        status, answer, _ = served[0].infer("digits", head + digits_dir[1][:1].tobytes(),
                                            headers={"Inference-Header-Content-Length": str(len(head))})
        assert code == "StatusCode.INVALID_ARGUMENT" and status == 400 and line == answer["error"], (shape, code, line)
    assert "Traceback" not in served[0].err


def test_errors_reach_tritonclient_grpc_with_their_codes(served, digits_dir, tmp_path):
    x = digits_dir[1].copy()
    x[1, 5] = np.nan
    out = _grpc(served[1], x, """
        out["unknown"] = err(lambda: client.infer("nope", [infer_input(x[:1])]))
        out["version"] = err(lambda: client.infer("digits", [infer_input(x[:1])], model_version="3"))
        out["shape"] = err(lambda: client.infer("digits", [infer_input(np.zeros((1, 63), "float32"))]))
        out["dtype"] = err(lambda: client.infer("digits", [infer_input(np.zeros((1, 64), "float64"), "FP64")]))
        out["nan"] = err(lambda: client.infer("digits", [infer_input(x[1:2])]))
        out["metadata"] = err(lambda: client.get_model_metadata("nope"))
        out["ready"] = err(lambda: client.is_model_ready("nope"))
        out["repository"] = client.get_model_repository_index(as_json=True)["models"]
    """, tmp_path)
    assert out["unknown"][0] == "StatusCode.NOT_FOUND" and "model 'nope' is not served here" in out["unknown"][1]
    assert out["version"][0] == "StatusCode.NOT_FOUND" and "version 1 only" in out["version"][1]
    assert out["shape"][0] == "StatusCode.INVALID_ARGUMENT" and "dimension 1 must be 64" in out["shape"][1]
    assert out["dtype"][0] == "StatusCode.INVALID_ARGUMENT"
    assert "datatype FP64, the model takes FP32" in out["dtype"][1]
    assert out["nan"][0] == "StatusCode.INVALID_ARGUMENT" and "value at [0, 5] is NaN" in out["nan"][1]
    # the same one line as HTTP v2's 400
    body = (b'{"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [' + b"0, " * 5 + b"NaN"
            + b", 0" * 58 + b"]}]}")
    status, answer, _ = served[0].infer("digits", body)
    assert status == 400 and answer["error"] == out["nan"][1]
    assert out["metadata"][0] == out["ready"][0] == "StatusCode.NOT_FOUND"
    assert out["repository"] == [{"name": "digits", "version": "1", "state": "READY"}]  # proto3 leaves out ""
    assert all("\n" not in line for _, line in (v for k, v in out.items() if v and k != "repository"))
    text = served[0].request("GET", "/metrics")[1]
    assert 'protocol="grpc",status="200"' in text and 'protocol="grpc",status="400"' in text


def test_a_message_over_max_body_bytes_is_refused(digits_dir, tmp_path):
    server, port = _start(digits_dir, "--max_body_bytes", "1024")
    try:
        out = _grpc(port, digits_dir[1], """
            out["big"] = err(lambda: client.infer("digits", [infer_input(np.zeros((8, 64), "float32"))]))  # 2 KiB
            out["small"] = list(client.infer("digits", [infer_input(x[:1])]).as_numpy("logits").shape)
        """, tmp_path)
        assert out["big"][0] == "StatusCode.RESOURCE_EXHAUSTED"
        assert out["small"] == [1, 10]  # the server goes on
    finally:
        assert server.stop() == 0


def test_sigterm_stops_the_grpc_server_within_the_drain(digits_dir, tmp_path):
    server, port = _start(digits_dir, "--drain_timeout", "8")
    signalled = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    code = server.stop(timeout=patience(60))
    assert code == 0, server.err
    assert time.monotonic() - signalled < patience(8) + 2
    out = _grpc(port, digits_dir[1], """
        out["live"] = err(lambda: client.is_server_live(client_timeout=30))
    """, tmp_path)
    assert out["live"][0] == "StatusCode.UNAVAILABLE"  # the port is closed
    assert "SIGTERM received" in server.err and "exit 0" in server.err


def test_grpc_port_flag_checks(digits_dir):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "trainer.cli", "serve", digits_dir[0], "--port", "0",
                              "--grpc_port", str(port)], check=False, capture_output=True, text=True, cwd=REPO,
                             timeout=patience(180))
    assert out.returncode == 2 and f"--grpc_port {port}: cannot listen there (Address already in use)" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    out = subprocess.run([sys.executable, "-m", "trainer.cli", "serve", "/nonexistent", "--grpc_port", "70000"],
                         check=False, capture_output=True, text=True, cwd=REPO, timeout=patience(120))
    assert out.returncode == 2 and "--grpc_port 70000 is not allowed" in out.stderr, out.stderr
    hidden = ("import sys; sys.modules['grpc'] = None; from trainer.cli import main; "
              "sys.exit(main(['serve', '/nonexistent', '--grpc_port', '9']))")
    out = subprocess.run([sys.executable, "-c", hidden], check=False, capture_output=True, text=True, cwd=REPO,
                         timeout=patience(120))
    assert out.returncode == 2 and 'pip install -e ".[serve]"' in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_drain_under_grpc_load_answers_or_refuses_every_call(digits_dir, tmp_path):
    """SIGTERM while 8 clients call ModelInfer in a loop: every call is answered (OK) or refused (UNAVAILABLE: the
    drain's line, or the closed port), none is cut, and the report counts the gRPC calls."""
    server, port = _start(digits_dir, "--drain_timeout", "8")
    np.save(tmp_path / "x.npy", digits_dir[1])
    script = PRELUDE + textwrap.dedent("""
        import collections, threading, time
        codes, lines, lock = collections.Counter(), set(), threading.Lock()
        def loop():
            client = grpcclient.InferenceServerClient(address)
            refused, deadline = 0, time.monotonic() + 120
            while refused < 3 and time.monotonic() < deadline:
                try:
                    client.infer("digits", [infer_input(x[:1])], client_timeout=60)
                    code = "OK"
                except InferenceServerException as exc:
                    code = exc.status()
                    refused += 1
                    with lock:
                        lines.add(exc.message()[:80])
                with lock:
                    codes[code] += 1
                    if codes["OK"] == 40:
                        print("going", flush=True)
        threads = [threading.Thread(target=loop) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out["codes"], out["lines"] = dict(codes), sorted(lines)
    """) + "\nprint(json.dumps(out))\n"
    def sigterm():
        server.proc.send_signal(signal.SIGTERM)
        assert server.stop(timeout=patience(60)) == 0, server.err

    out = _while_clients_call(port, script, tmp_path, sigterm)
    assert set(out["codes"]) <= {"OK", "StatusCode.UNAVAILABLE"}, out
    assert out["codes"]["OK"] >= 40 and out["codes"]["StatusCode.UNAVAILABLE"] >= 24, out
    report = [line for line in server.err.splitlines() if "SIGTERM received" in line][0]
    accepted, answered = map(int, re.search(r"(\d+) requests accepted, (\d+) answered", report).groups())
    assert accepted == answered >= 40 and " 0 cut" in report and "exit 0" in report, report


def _slow(slow_dir, *flags):
    port = _free_port()
    server = Server(slow_dir, "--model_name", "slow", "--max_batch_size", "2048", "--max_delay_ms", "0",
                    "--grpc_port", str(port), *flags)
    return server, port


SLOW_CLIENTS = """
    import collections, os, threading, time
    name = client.get_model_metadata("slow").inputs[0].name
    codes, lines, lock = collections.Counter(), {}, threading.Lock()
    deadline = time.monotonic() + 150  # a client that never sees what the test waits for ends, and the test says so
    def call(rows=1):  # 2048 rows: one model call of about a second, alone in its batch
        inp = grpcclient.InferInput(name, [rows, 64], "FP32")
        inp.set_data_from_numpy(np.full((rows, 64), 0.2, "float32"))
        try:
            client.infer("slow", [inp], client_timeout=120)
            code = "OK"
        except InferenceServerException as exc:
            code = exc.status()
            with lock:
                lines.setdefault(code, exc.message())
        with lock:
            codes[code] += 1
        return code
    def clients(target, n, also=()):
        threads = [threading.Thread(target=target) for _ in range(n)]
        for t in threads:
            t.start()
        for t in list(threads) + list(also):
            t.join()
        out["codes"], out["lines"] = dict(codes), lines
        codes.clear()
        call()  # one more, after them
        out["after"] = dict(codes)
"""


def test_a_full_queue_answers_resource_exhausted_and_the_server_goes_on(slow_dir, tmp_path):
    """--max_queue 2, the predictor inside a long call, and 24 clients at once: each call is answered or refused with
    RESOURCE_EXHAUSTED and HTTP's line naming the flag (the 503 of /v1 and /v2), and a call after the burst is
    answered."""
    server, port = _slow(slow_dir, "--max_queue", "2")
    try:
        out = _grpc(port, np.zeros((1, 64), "float32"), textwrap.dedent(SLOW_CLIENTS) + textwrap.dedent("""
            bigs = [threading.Thread(target=call, args=(2048,)) for _ in range(2)]  # the predictor busy a while
            for t in bigs:
                t.start()
            time.sleep(0.3)
            def burst():
                for _ in range(2):
                    call()
            clients(burst, 24, also=bigs)
        """), tmp_path)
        assert set(out["codes"]) <= {"OK", "StatusCode.RESOURCE_EXHAUSTED"}, out
        assert out["codes"].get("OK") and out["codes"].get("StatusCode.RESOURCE_EXHAUSTED"), out
        assert "--max_queue 2" in out["lines"]["StatusCode.RESOURCE_EXHAUSTED"], out["lines"]
        assert out["after"] == {"OK": 1}
    finally:
        assert server.stop() == 0


def test_a_killed_predictor_gives_internal_to_its_calls_and_is_restarted(slow_dir, tmp_path):
    """SIGKILL to the predictor process while it runs a long call, under 4 more gRPC clients: the calls it held get
    INTERNAL naming the signal, every other call is answered, and calls after the restart are answered by the new
    process."""
    server, port = _slow(slow_dir)
    stop = tmp_path / "stop"
    try:
        np.save(tmp_path / "x.npy", np.zeros((1, 64), "float32"))
        script = PRELUDE + textwrap.dedent(SLOW_CLIENTS) + textwrap.dedent(f"""
            def going():
                return not os.path.exists({str(stop)!r}) and time.monotonic() < deadline
            def loop():
                while going():
                    call()
            def big():  # back to back: the predictor is nearly always inside one of these
                while going():
                    if call(2048) == "OK" and codes["OK"] >= 20 and not printed:
                        printed.append(print("going", flush=True))
            printed, heavy = [], threading.Thread(target=big)
            heavy.start()
            clients(loop, 4, also=[heavy])
        """) + "\nprint(json.dumps(out))\n"
        def kill_predictor():
            time.sleep(0.3)  # inside the next 2048-row call
            os.kill(server.pids[0], signal.SIGKILL)
            deadline = time.monotonic() + patience(60)
            while time.monotonic() < deadline and "is ready" not in server.err.split("killed by SIGKILL")[-1]:
                time.sleep(0.1)
            time.sleep(0.5)
            stop.write_text("")

        out = _while_clients_call(port, script, tmp_path, kill_predictor)
        assert set(out["codes"]) <= {"OK", "StatusCode.INTERNAL"}, out
        assert out["codes"].get("StatusCode.INTERNAL") and out["codes"]["OK"] >= 20, out
        assert "killed by SIGKILL" in out["lines"]["StatusCode.INTERNAL"], out["lines"]
        assert out["after"] == {"OK": 1}
        assert "ptrain_serve_worker_restarts_total 1.0" in server.request("GET", "/metrics")[1]
    finally:
        assert server.stop() == 0


def test_concurrent_calls_share_model_calls_and_a_lone_call_runs_in_the_server(digits_dir, tmp_path):
    """The default placement of a tiny model runs a lone request in the server process. grpc.aio hands the server one
    call per turn of its event loop, so a call run there at once never saw the others and every call ran alone (mean
    batch 1.0 at 32 clients): a call decides after one more turn. 16 clients for 2 s share model calls in the
    predictor process; a lone call is answered in the server process (while the predictor process is stopped)."""
    port = _free_port()
    server = Server(digits_dir[0], "--model_name", "digits", "--max_delay_ms", "20", "--grpc_port", str(port))
    try:
        assert "a lone request runs in the server process" in server.err_with("a lone request runs")
        before = batch_stats(server)
        out = _grpc(port, digits_dir[1][:1], """
            import collections, threading, time
            codes, lock, x1 = collections.Counter(), threading.Lock(), x[:1].astype("float32")
            stop_at = time.monotonic() + 2.0
            def caller():
                while time.monotonic() < stop_at:
                    try:
                        client.infer("digits", [infer_input(x1)], client_timeout=60)
                        code = "OK"
                    except InferenceServerException as exc:
                        code = exc.status()
                    with lock:
                        codes[code] += 1
            threads = [threading.Thread(target=caller) for _ in range(16)]  # one tritonclient: unary calls are safe
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            out["codes"] = dict(codes)
        """, tmp_path)
        after = batch_stats(server)
        calls, rows = after[0] - before[0], after[1] - before[1]
        assert set(out["codes"]) == {"OK"} and rows == out["codes"]["OK"], (out, calls, rows)
        assert calls < rows / 2, (calls, rows)  # shared model calls (before: calls == rows)

        (expected,) = run_predictor(create_predictor(digits_dir[0]), [digits_dir[1][:1]])
        time.sleep(0.5)  # quiet: the last model call ended over 50 ms + --max_delay_ms ago (batching.IDLE_AFTER)
        os.kill(server.pids[0], signal.SIGSTOP)  # a call queued for the predictor process would wait for SIGCONT
        try:
            out = _grpc(port, digits_dir[1][:1], """
                result = client.infer("digits", [infer_input(x.astype("float32"))], client_timeout=20)
                out["logits"] = result.as_numpy(result.get_response().outputs[0].name).tolist()
            """, tmp_path)
        finally:
            os.kill(server.pids[0], signal.SIGCONT)
        np.testing.assert_array_equal(np.asarray(out["logits"], dtype="float32"), expected)
    finally:
        assert server.stop() == 0
