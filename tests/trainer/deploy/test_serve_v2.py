"""The Open Inference Protocol (v2) of ptrain serve, spoken by the clients people run: tritonclient's HTTP client,
unchanged, and curl, against a real server process; answers equal paddle.inference's bitwise (a request alone runs
alone, so its batch is the same one)."""

import concurrent.futures as cf
import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from patience import patience
from serving import Server

from trainer.deploy.predictor import create_predictor, run_predictor
from trainer.deploy.served import default_model_name

httpclient = pytest.importorskip("tritonclient.http", reason="the test extra installs tritonclient[http]")
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(scope="module")
def server(digits_dir):
    # --workers 1: every request through the batcher (by default a lone digits request runs in the server process)
    server = Server(digits_dir[0], "--workers", "1", "--model_name", "digits", "--output_names", "logits",
                    "--max_batch_size", "8", "--max_delay_ms", "20")
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=120.0)
    yield client
    client.close()


def test_health_metadata_and_readiness_through_tritonclient(client):
    assert client.is_server_live() is True
    assert client.is_server_ready() is True
    assert client.is_model_ready("digits") is True
    assert client.is_model_ready("digits", "1") is True
    assert client.is_model_ready("nope") is False
    meta = client.get_server_metadata()
    assert meta["name"] == "ptrain-serve" and "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("digits")
    assert model["name"] == "digits" and model["versions"] == ["1"] and model["platform"] == "paddle_inference"
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert model["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    assert client.get_model_metadata("digits", "1") == model


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_equals_paddle_inference_bitwise(client, digits_dir, binary):
    path, x = digits_dir
    (expected,) = run_predictor(create_predictor(path), [x[:3]])
    inp = httpclient.InferInput("input", [3, 64], "FP32")
    inp.set_data_from_numpy(x[:3], binary_data=binary)
    result = client.infer("digits", [inp], outputs=[httpclient.InferRequestedOutput("logits", binary_data=binary)],
                          request_id="r-7")
    got = result.as_numpy("logits")
    assert got.dtype == np.float32 and got.shape == (3, 10)
    np.testing.assert_array_equal(got, expected)
    response = result.get_response()
    assert response["model_name"] == "digits" and response["model_version"] == "1" and response["id"] == "r-7"
    assert ("parameters" in response["outputs"][0]) is binary


def test_infer_without_outputs_answers_every_output_in_binary(client, digits_dir):
    path, x = digits_dir
    (expected,) = run_predictor(create_predictor(path), [x[3:4]])
    inp = httpclient.InferInput("input", [1, 64], "FP32")
    inp.set_data_from_numpy(x[3:4])
    result = client.infer("digits", [inp], model_version="1")  # sets binary_data_output
    np.testing.assert_array_equal(result.as_numpy("logits"), expected)
    assert result.get_response()["outputs"][0]["parameters"]["binary_data_size"] == 40


def _error(call):
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value.status(), info.value.message()


def test_errors_reach_tritonclient_as_one_line(client, digits_dir):
    x = digits_dir[1]

    def infer(name="digits", array=x[:1], datatype="FP32", outputs=None, binary=True, version=""):
        inp = httpclient.InferInput("input", list(array.shape), datatype)
        inp.set_data_from_numpy(array, binary_data=binary)
        return client.infer(name, [inp], outputs=outputs, model_version=version)

    status, line = _error(lambda: infer(name="nope"))
    assert status == "404" and "model 'nope' is not served here" in line and "digits" in line
    status, line = _error(lambda: infer(version="3"))
    assert status == "404" and "version 1 only" in line
    status, line = _error(lambda: infer(array=np.zeros((1, 63), "float32")))
    assert status == "400" and "dimension 1 must be 64" in line
    status, line = _error(lambda: infer(array=np.zeros((1, 64), "float64"), datatype="FP64"))
    assert status == "400" and "datatype FP64, the model takes FP32" in line
    status, line = _error(lambda: infer(array=np.zeros((9, 64), "float32")))
    assert status == "400" and "at most 8 (--max_batch_size)" in line
    bad = x[:1].copy()
    bad[0, 5] = np.nan
    for binary in (True, False):
        status, line = _error(lambda: infer(array=bad, binary=binary))
        assert status == "400" and "value at [0, 5] is NaN" in line and "--allow_nonfinite" in line, line
    status, line = _error(lambda: infer(outputs=[httpclient.InferRequestedOutput("fetch_name_0")]))
    assert status == "400" and "no output 'fetch_name_0': it has logits" in line
    status, line = _error(lambda: client.get_model_metadata("nope"))
    assert status == "404"
    for _, message in (_error(lambda: infer(name="nope")),):
        assert "\n" not in message


def _v2(shape, data=(0.0,) * 64):
    return {"inputs": [{"name": "input", "shape": shape, "datatype": "FP32", "data": list(data)}]}


BAD_V2 = [  # (body, headers, a piece of the 400 line)
    (b"{", {}, 'the body is not JSON (Expecting property name enclosed in double quotes at line 1 column 2): send JSON '
     'such as {"inputs": [{"name": ..., "shape": [...], "datatype": "FP32", "data": [...]}]}'),  # v2's shape, not v1's
    (b"", {}, 'the body is empty: send JSON such as {"inputs": [{"name": ..., "shape": [...]'),
    ({"inputs": []}, {}, '"inputs" must be a non-empty list'),
    ({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32"}]}, {}, '"data" is missing'),
    ({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 63}]}, {},
     '"data" has 63 values, shape [1, 64] needs 64'),
    ({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "STRING", "data": [0] * 64}]}, {},
     "datatype 'STRING' is not served"),
    ({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0] * 64}]}, {}, "unknown 'x'"),
    ({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [1e39] + [0] * 63}]}, {},
     "value at [0, 0] is Infinity (or beyond float32's range)"),
    (b'{"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [-Infinity' + b", 0" * 63 + b"]}]}",
     {}, "is -Infinity"),
    ({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "parameters": {"binary_data_size": 256}}]},
     {"Inference-Header-Content-Length": "999999"}, "Inference-Header-Content-Length '999999' is not a byte count"),
    # a superscript two: str.isdigit() takes it, int() does not (issue 40, item 6)
    ({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0] * 64}]},
     {"Inference-Header-Content-Length": "\xb2"}, "Inference-Header-Content-Length '\xb2' is not a byte count"),
    # shapes numpy cannot make, or only by allocating 10**18 values (item 5): refused before any array is made
    (_v2([1] * 64 + [64]), {}, '"shape" [1, 1, 1, 1, 1, 1, 1, 1, ...] has 65 dimensions, the model\'s input has 2'),
    (_v2([1] * 10 ** 6 + [64]), {}, "has 1000001 dimensions, the model's input has 2 ([N, 64])"),
    (_v2([True, 64]), {}, '"shape" must be a list of sizes >= 0, e.g. [1, 64], got [True, 64]'),
    (_v2([-1, 64]), {}, "got [-1, 64]"),
    (_v2([1.0, 64]), {}, "got [1.0, 64]"),
    (_v2([10 ** 9, 10 ** 9]), {}, "1000000000 instances in one request"),
    (_v2([1, 2 ** 62], []), {}, "is beyond any tensor's size"),
    (_v2([0, 2 ** 62, 2 ** 62], []), {}, "has 3 dimensions"),
    (_v2([0, 64], []), {}, "the batch is empty"),
    (_v2([2, 64]), {}, '"data" has 64 values, shape [2, 64] needs 128'),
    (_v2([1, 64], [True] * 64), {}, "datatype FP32 takes numbers, got true/false"),
    (_v2([1, 64], [0.5] * 63 + [False]), {}, "datatype FP32 takes numbers, got true/false"),
    (b'{"id": ' + b"[" * 900 + b"]" * 900 + b', "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", '
     b'"data": [' + b", ".join([b"0"] * 64) + b"]}]}", {}, '"id" must be a string'),  # once a RecursionError: 500
]


@pytest.mark.parametrize("body,headers,line", BAD_V2, ids=[str(i) for i in range(len(BAD_V2))])
def test_bad_v2_requests_get_400_with_one_line(server, body, headers, line):
    status, answer, _ = server.infer("digits", body, headers=headers)
    assert status == 400 and line in answer["error"] and "\n" not in answer["error"], answer
    assert len(answer["error"]) < 400, "the line echoes the request back"
    assert "Traceback" not in server.err


def test_curl_speaks_v2_and_both_protocols_share_one_batcher(server, digits_dir):
    path, x = digits_dir
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed (apt-get install curl)")
    base = f"http://127.0.0.1:{server.port}"
    ready = subprocess.run([curl, "-s", "-o", "/dev/null", "-w", "%{http_code}", base + "/v2/health/ready"],
                           capture_output=True, text=True, timeout=patience(60))
    assert ready.stdout == "200"
    body = json.dumps({"inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32",
                                   "data": x[:2].ravel().tolist()}]})
    out = subprocess.run([curl, "-s", base + "/v2/models/digits/infer", "-d", body], capture_output=True, text=True,
                         timeout=patience(60))
    (expected,) = run_predictor(create_predictor(path), [x[:2]])
    answer = json.loads(out.stdout)["outputs"][0]
    assert answer["name"] == "logits" and answer["shape"] == [2, 10]
    np.testing.assert_array_equal(np.asarray(answer["data"], "float32").reshape(2, 10), expected)

    predictor = create_predictor(path)
    alone = [run_predictor(predictor, [x[i:i + 1]])[0] for i in range(16)]
    before = _calls(server)

    def one(i):
        if i % 2:
            return server.predict({"inputs": x[i:i + 1].tolist()})[1]["outputs"]
        v2 = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": x[i].tolist()}]}
        return np.asarray(server.infer("digits", v2)[1]["outputs"][0]["data"]).reshape(1, 10)

    with cf.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(16)))
    for i, got in enumerate(answers):
        np.testing.assert_allclose(np.asarray(got, "float32"), alone[i], rtol=1e-5, atol=1e-6)
    calls = _calls(server) - before
    assert calls < 16, calls  # v1 and v2 requests shared model calls
    text = server.request("GET", "/metrics")[1]
    assert re.search(r'ptrain_serve_requests_total\{model="digits",protocol="v2",status="200"\} [1-9]', text)
    assert re.search(r'ptrain_serve_requests_total\{model="digits",protocol="v1",status="200"\} [1-9]', text)


def _calls(server):
    text = server.request("GET", "/metrics")[1]
    return float(re.search(r"^ptrain_serve_batch_size_count (\S+)", text, re.M).group(1))


def test_default_model_names():
    assert default_model_name("runs/digits-demo/inference") == "digits-demo"
    assert default_model_name("runs/digits-demo/inference/") == "digits-demo"
    assert default_model_name("/srv/my model") == "my-model"
    assert default_model_name("runs/x/inference", "ernie") == "ernie"


def test_several_models_from_a_repository_each_with_its_own_predictors(digits_dir, slow_dir, tmp_path):
    """A Triton-style model repository (digits/ at version 1, wide/3/ at version 3) and NAME=DIR beside it:
    each model has its own metadata, readiness, answers and predictor processes."""
    repo = tmp_path / "repo"
    shutil.copytree(digits_dir[0], repo / "digits")
    shutil.copytree(slow_dir, repo / "wide" / "3")
    (repo / "wide" / "1").mkdir()  # an empty version folder is not a model
    server = Server([str(repo), f"other={digits_dir[0]}"], "--workers", "1", "--output_names", "scores",
                    "--max_delay_ms", "0")
    try:
        assert len(server.pids) == 3  # one predictor process per model
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=120.0)
        assert client.is_server_ready()
        assert all(client.is_model_ready(name) for name in ("digits", "wide", "other"))
        assert client.is_model_ready("wide", "3") and not client.is_model_ready("wide", "1")
        assert client.get_model_metadata("wide")["versions"] == ["3"]
        x = digits_dir[1][:2]
        for name, path in (("digits", digits_dir[0]), ("wide", slow_dir), ("other", digits_dir[0])):
            (expected,) = run_predictor(create_predictor(path), [x])
            inp = httpclient.InferInput(client.get_model_metadata(name)["inputs"][0]["name"], [2, 64], "FP32")
            inp.set_data_from_numpy(x)
            np.testing.assert_array_equal(client.infer(name, [inp]).as_numpy("scores"), expected)
            status, body, _ = server.request("POST", f"/v1/models/{name}/predict", {"inputs": x.tolist()})
            assert status == 200
            np.testing.assert_array_equal(np.asarray(body["outputs"], "float32"), expected)
        status, ready, _ = server.request("GET", "/ready")
        assert status == 200 and ready["models"] == {"digits": "1", "wide": "3", "other": "1"}
        client.close()
    finally:
        assert server.stop() == 0


def test_names_that_clash_or_do_not_fit_exit_2(digits_dir, tmp_path):
    import os
    import sys

    from serving import ROOT

    def run(*args):
        return subprocess.run([sys.executable, "-m", "trainer.cli", "serve", *args, "--port", "0"],
                              capture_output=True, text=True, timeout=patience(120), env=dict(os.environ, PYTHONPATH=ROOT),
                              cwd=ROOT)

    r = run(f"a={digits_dir[0]}", f"a={digits_dir[0]}")
    assert r.returncode == 2 and "several models are named a: name them apart with NAME=DIR" in r.stderr
    r = run(digits_dir[0], "--model_name", "bad/name")
    assert r.returncode == 2 and "--model_name 'bad/name' is not allowed" in r.stderr
    r = run(digits_dir[0], "--output_names", "a,b")
    assert r.returncode == 2 and "--output_names a,b: the model has 1 output(s)" in r.stderr
    repo = tmp_path / "only-bad-names"
    shutil.copytree(digits_dir[0], repo / "my model")
    r = run(str(repo))
    assert r.returncode == 2 and "holds no model this server can serve: 'my model' (a model's name is" in r.stderr


def test_a_repository_names_every_folder_it_does_not_serve(digits_dir, tmp_path):
    """``good``, ``my model``, ``modèle`` (three complete exports) and ``notes`` (no export): only ``good`` is served
    (the naming rule of docs/reference/serve.md), and one warning line at start names the three others with their
    reasons, as ``/v2/repository/index`` does (once: only ``good`` was served, and nothing said so)."""
    repo = tmp_path / "repo"
    for name in ("good", "my model", "modèle"):
        shutil.copytree(digits_dir[0], repo / name)
    (repo / "notes").mkdir()
    (repo / "README").write_text("a file: not a folder of the repository")
    server = Server(str(repo), "--workers", "0")
    try:
        warnings = [line for line in server.err_with("not serving").splitlines() if "not serving" in line]
        assert len(warnings) == 1, server.err
        line = warnings[0]
        assert "warning: not serving 3 folder(s) of the model repository: 'modèle', 'my model' (a model's name is " \
               "letters, digits, '_', '.', '-'" in line and "'notes' (no exported model in it" in line, line
        assert "GET /v2/repository/index lists them" in line
        status, index, _ = server.request("GET", "/v2/repository/index")
        assert status == 200 and [(e["name"], e["state"]) for e in index] == [
            ("good", "READY"), ("modèle", "UNAVAILABLE"), ("my model", "UNAVAILABLE"), ("notes", "UNAVAILABLE")]
        assert index[1]["reason"].startswith("not served: a model's name is letters") and index[0]["version"] == "1"
        status, index, _ = server.request("POST", "/v2/repository/index", {"ready": True})
        assert status == 200 and [e["name"] for e in index] == ["good"]
        status, answer, _ = server.request("POST", "/v2/repository/index", {"ready": "yes"})
        assert status == 400 and "ready" in answer["error"]
        assert server.request("GET", "/v2/models/good/ready")[0] == 200
    finally:
        assert server.stop() == 0


def test_allow_nonfinite_passes_nan_to_the_model(digits_dir):
    path, x = digits_dir
    row = x[:1].copy()
    row[0, 3] = np.nan
    (expected,) = run_predictor(create_predictor(path), [row])
    server = Server(path, "--allow_nonfinite", "--model_name", "digits")
    try:
        body = b'{"inputs": [' + json.dumps(row[0].tolist()).encode() + b"]}"  # json.dumps writes NaN
        status, answer, _ = server.predict(body)
        assert status == 200
        np.testing.assert_array_equal(np.asarray(answer["outputs"], "float32"), expected)  # NaN where paddle's is
        inp = httpclient.InferInput("input", [1, 64], "FP32")
        inp.set_data_from_numpy(row)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=120.0)
        np.testing.assert_array_equal(client.infer("digits", [inp]).as_numpy("output"), expected)
        client.close()
    finally:
        assert server.stop() == 0


def test_workers_0_runs_the_model_in_the_server_process(digits_dir):
    path, x = digits_dir
    (expected,) = run_predictor(create_predictor(path), [x[:2]])
    server = Server(path, "--workers", "0", "--model_name", "digits", "--output_names", "logits")
    try:
        assert server.pids == [server.proc.pid]  # no predictor process
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=120.0)
        assert client.is_server_ready() and client.is_model_ready("digits")
        inp = httpclient.InferInput("input", [2, 64], "FP32")
        inp.set_data_from_numpy(x[:2])
        np.testing.assert_array_equal(client.infer("digits", [inp]).as_numpy("logits"), expected)
        client.close()
        status, body, _ = server.predict({"inputs": x[:2].tolist()})
        assert status == 200
        np.testing.assert_array_equal(np.asarray(body["outputs"], "float32"), expected)
        with cf.ThreadPoolExecutor(8) as pool:  # concurrent clients: each answered
            answers = list(pool.map(lambda i: server.predict({"inputs": x[i:i + 1].tolist()}), range(8)))
        assert [a[0] for a in answers] == [200] * 8
    finally:
        server.pids = []
        assert server.stop() == 0
