"""Fuzzing the request parsers of ptrain serve: v1 JSON, v2 JSON and binary-extension bodies, their headers, and gRPC
ModelInfer. The property: a client error (400 / 413, INVALID_ARGUMENT / RESOURCE_EXHAUSTED) or a valid answer, never
a server error (5xx, UNKNOWN, INTERNAL) and never a traceback in the server's log.

The parsers are fuzzed in this process first (thousands of cases a second), then the same generators run against a
real server process over HTTP and, from a child process (tritonclient.grpc's protobuf pool, see test_serve_grpc.py),
over gRPC. ``PTRAIN_FUZZ_EXAMPLES=N`` multiplies every example count by N for a longer run.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from patience import patience
from serving import Server

from trainer.deploy.oip import DATATYPES, InferRequest, parse_infer, split_body
from trainer.deploy.payload import BadRequest, has_booleans, parse_inputs, parse_json

SCALE = int(os.environ.get("PTRAIN_FUZZ_EXAMPLES", "1"))


def fuzz(examples):
    return settings(max_examples=examples * SCALE, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


DIGITS = [{"name": "input", "shape": [-1, 64], "dtype": "float32"}]
TEXT = [{"name": "ids", "shape": [-1, -1], "dtype": "int64"}, {"name": "mask", "shape": [-1, -1], "dtype": "float32"}]
OUTPUTS = ["logits"]
MAX_ROWS = 8

# --- the generators -------------------------------------------------------------------------------------------------
HUGE = st.sampled_from([2 ** 31, 2 ** 32 + 1, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 64, 10 ** 18, 10 ** 30])
DIM = st.one_of(st.integers(0, 70), st.integers(-3, -1), HUGE, st.booleans(), st.floats(allow_nan=True),
                st.none(), st.text(max_size=3))
SHAPE = st.one_of(st.lists(DIM, max_size=6), st.lists(st.integers(0, 2), min_size=60, max_size=70),
                  st.just([1] * 2000), st.integers(), st.text(max_size=5), st.none(),
                  st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))
DATATYPE = st.one_of(st.sampled_from(list(DATATYPES) + ["BYTES", "STRING", "fp32", "", "FP8"]), st.none(),
                     st.integers(), st.booleans())
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(), st.text(max_size=4))
JSON = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner,
                                                                                        max_size=4), max_leaves=40)
NUMBERS = st.one_of(st.lists(st.floats(width=32), min_size=0, max_size=130),
                    st.lists(st.integers(-2 ** 40, 2 ** 40), max_size=130),
                    st.lists(st.lists(st.floats(-10, 10, width=32), min_size=64, max_size=64), min_size=1,
                             max_size=3),
                    st.lists(st.booleans(), max_size=70), JSON)
SIZE = st.one_of(st.integers(-5, 600), HUGE, st.booleans(), st.floats(), st.text(max_size=3), st.none())
NAME = st.one_of(st.sampled_from(["input", "ids", "mask", "x", ""]), st.text(max_size=8), st.integers(), st.none())


@st.composite
def tensors(draw):
    tensor = {"name": draw(NAME), "shape": draw(SHAPE), "datatype": draw(DATATYPE)}
    if draw(st.booleans()):
        tensor["data"] = draw(NUMBERS)
    else:
        tensor["parameters"] = draw(st.one_of(st.fixed_dictionaries({"binary_data_size": SIZE}), JSON))
    if draw(st.integers(0, 9)) == 0:  # a key of its own replaced by anything
        tensor[draw(st.sampled_from(["name", "shape", "datatype", "data", "parameters"]))] = draw(JSON)
    return tensor


@st.composite
def consistent_shapes(draw):
    """Shapes whose values a request can carry: a few small sizes, then maybe dozens of 1s (numpy stops at 64
    dimensions), maybe a 0 beside huge sizes (no values, and an array of 10**18 if made)."""
    shape = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)) + [draw(st.sampled_from([64, 1, 2, 0]))]
    if draw(st.booleans()):
        shape[1:1] = [1] * draw(st.integers(1, 100))
    if draw(st.integers(0, 3)) == 0:
        shape[draw(st.integers(0, len(shape) - 1))] = 0
        shape.insert(draw(st.integers(0, len(shape))), draw(HUGE))
    return shape


@st.composite
def consistent_tensor(draw, name):
    """``(tensor, binary bytes)``: values that fit the tensor's own shape and datatype (the model may not take it)."""
    kind = draw(st.sampled_from(["FP32", "FP32", "FP64", "INT64", "BOOL", "UINT8"]))
    shape = draw(consistent_shapes())
    count = int(np.prod([min(d, 2 ** 20) for d in shape], dtype=object))
    count = count if count <= 512 else draw(st.integers(0, 3))
    dtype = np.dtype(DATATYPES[kind])
    if draw(st.booleans()):
        blob = draw(st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize))
        return {"name": name, "shape": shape, "datatype": kind, "parameters": {"binary_data_size": len(blob)}}, blob
    values = {"b": st.booleans(), "f": st.floats(-1e3, 1e3), "i": st.integers(-100, 100),
              "u": st.integers(0, 255)}[dtype.kind]
    return {"name": name, "shape": shape, "datatype": kind, "data": draw(st.lists(values, min_size=count,
                                                                                   max_size=count))}, b""


@st.composite
def v2_bodies(draw):
    """``(body bytes, Inference-Header-Content-Length or None)``: a v2 infer request, sane or not, JSON or binary."""
    if draw(st.booleans()):  # consistent in itself: what reaches numpy
        names = draw(st.sampled_from([["input"], ["ids", "mask"], ["mask"], ["x"]]))
        pairs = [draw(consistent_tensor(n)) for n in names]
        head = json.dumps({"inputs": [t for t, _ in pairs]}).encode()
        tail = b"".join(b for _, b in pairs)
        return head + tail, (str(len(head)) if tail or draw(st.booleans()) else None)
    obj = {"inputs": draw(st.one_of(st.lists(tensors(), max_size=3), JSON))}
    if draw(st.booleans()):
        obj["outputs"] = draw(st.one_of(st.lists(st.fixed_dictionaries({"name": NAME, "parameters": JSON}),
                                                 max_size=2), JSON))
    if draw(st.integers(0, 4)) == 0:
        obj["parameters"] = draw(JSON)
    if draw(st.integers(0, 4)) == 0:
        obj["id"] = draw(st.one_of(JSON, st.just("DEEP")))
    head = json.dumps(obj if draw(st.integers(0, 9)) else draw(JSON)).encode()
    depth = draw(st.integers(1, 3000))  # JSON nested deeper than Python's repr and json go
    head = head.replace(b'"DEEP"', b"[" * depth + b"]" * depth)
    if draw(st.booleans()):
        return head, None
    tail = draw(st.binary(max_size=600))
    header = draw(st.one_of(st.just(str(len(head))), st.integers(-3, len(head) + 700).map(str),
                            st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=6),
                            st.sampled_from(["\xb2", "\xb9", " 12", "0x10", "1e3", "+5", "-0", ""])))
    return head + tail, header


@st.composite
def v1_bodies(draw):
    value = draw(st.one_of(NUMBERS, st.lists(NUMBERS, max_size=3),
                           st.dictionaries(st.sampled_from(["input", "x"]), NUMBERS, max_size=2)))
    obj = {"inputs": value} if draw(st.integers(0, 9)) else draw(JSON)
    return json.dumps(obj).encode()


# --- in this process ------------------------------------------------------------------------------------------------
def _v2(body, header, spec):
    try:
        obj, tail = split_body(body, header)
        req = parse_infer(obj, tail, spec, OUTPUTS, MAX_ROWS)
    except BadRequest as exc:
        assert exc.status in (400, 413) and "\n" not in str(exc) and len(str(exc)) < 1000, str(exc)
        return None
    assert isinstance(req, InferRequest) and 1 <= req.rows <= MAX_ROWS
    for array, s in zip(req.arrays, spec):
        assert array.dtype == s["dtype"] and array.ndim == len(s["shape"]) and array.shape[0] == req.rows
    return req


@fuzz(200)
@given(v2_bodies(), st.sampled_from([DIGITS, TEXT]))
def test_v2_parser_answers_a_request_or_refuses_it_with_one_line(case, spec):
    _v2(*case, spec)


@fuzz(100)
@given(v1_bodies())
def test_v1_parser_answers_a_request_or_refuses_it_with_one_line(body):
    for spec in (DIGITS, TEXT):
        try:
            arrays, rows = parse_inputs(parse_json(body), spec, MAX_ROWS)
        except BadRequest as exc:
            assert exc.status == 400 and "\n" not in str(exc) and len(str(exc)) < 1000, str(exc)
            continue
        assert 1 <= rows <= MAX_ROWS and all(a.dtype == s["dtype"] for a, s in zip(arrays, spec))
        value = json.loads(body)["inputs"]
        assert not any(has_booleans(v) for v in (value.values() if isinstance(value, dict) else [value]))


# --- against a real server ------------------------------------------------------------------------------------------
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(digits_dir):
    grpc_port = _free_port() if _has_grpc() else 0
    server = Server(digits_dir[0], "--model_name", "digits", "--max_batch_size", str(MAX_ROWS),
                    *(["--grpc_port", str(grpc_port)] if grpc_port else []))
    try:
        yield server, grpc_port
        assert "Traceback" not in server.err, server.err[-3000:]
    finally:
        assert server.stop() == 0


def _has_grpc():
    try:
        import grpc  # noqa: F401
        return True
    except ImportError:
        return False


def _never_a_server_error(server, status, answer):
    assert status < 500, answer
    assert "Traceback" not in server.err, server.err[-3000:]


@fuzz(40)
@given(v2_bodies())
def test_v2_over_http_is_a_client_error_or_an_answer(served, case):
    server = served[0]
    body, header = case
    headers = {} if header is None else {"Inference-Header-Content-Length": header}
    status, answer, _ = server.infer("digits", body, headers=headers)
    _never_a_server_error(server, status, answer)
    if status == 200:
        assert answer["outputs"][0]["name"] == "logits" if isinstance(answer, dict) else answer


@fuzz(30)
@given(v1_bodies(), st.sampled_from(["/v1/predict", "/v1/models/digits/predict"]))
def test_v1_over_http_is_a_client_error_or_an_answer(served, body, path):
    server = served[0]
    status, answer, _ = server.request("POST", path, body)
    _never_a_server_error(server, status, answer)
    if status == 200:
        assert np.asarray(answer["outputs"]).shape[1:] == (10,)


GRPC_FUZZ = """
import sys
import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2, service_pb2_grpc

address, examples = sys.argv[1], int(sys.argv[2])
channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1)])
stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
ALLOWED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED}
DIMS = st.one_of(st.integers(-3, 70), st.sampled_from([2 ** 31, 2 ** 62, 2 ** 63 - 1, -2 ** 63, 10 ** 18]))
TYPES = st.sampled_from(["FP32", "FP64", "FP16", "INT64", "INT32", "INT8", "UINT8", "UINT64", "BOOL", "BYTES",
                         "STRING", "", "fp32"])
CONTENTS = ["bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents", "fp32_contents",
            "fp64_contents", "bytes_contents"]
counts = {"ok": 0}

@st.composite
def requests(draw):
    request = service_pb2.ModelInferRequest(model_name=draw(st.sampled_from(["digits", "digits", "nope", ""])),
                                            model_version=draw(st.sampled_from(["", "", "1", "2", "x"])),
                                            id=draw(st.text(max_size=4)))
    raw = draw(st.booleans())
    if draw(st.booleans()):  # the digits input in a shape of its own whose bytes are all there
        shape = [1] * draw(st.integers(0, 100)) + draw(st.sampled_from([[1, 64], [64, 1], [0, 2 ** 62], [2, 32]]))
        count = 64 if 0 not in shape else 0
        request.inputs.add(name="input", datatype="FP32", shape=shape)
        request.raw_input_contents.append(bytes(4 * count))
        return request
    for _ in range(draw(st.integers(0, 3))):
        shape = draw(st.one_of(st.lists(DIMS, max_size=5), st.lists(st.integers(0, 2), min_size=60, max_size=110)))
        tensor = request.inputs.add(name=draw(st.sampled_from(["input", "x", ""])), datatype=draw(TYPES), shape=shape)
        if raw:
            request.raw_input_contents.append(draw(st.one_of(st.binary(max_size=600), st.just(bytes(256)))))
        else:
            field = draw(st.sampled_from(CONTENTS))
            values = {"bool_contents": st.booleans(), "bytes_contents": st.binary(max_size=3),
                      "fp32_contents": st.floats(width=32), "fp64_contents": st.floats(),
                      "int_contents": st.integers(-2 ** 31, 2 ** 31 - 1),
                      "int64_contents": st.integers(-2 ** 63, 2 ** 63 - 1),
                      "uint_contents": st.integers(0, 2 ** 32 - 1),
                      "uint64_contents": st.integers(0, 2 ** 64 - 1)}[field]
            getattr(tensor.contents, field).extend(draw(st.lists(values, max_size=130)))
    if draw(st.booleans()) and raw:
        request.raw_input_contents.append(draw(st.binary(max_size=8)))  # one more than the inputs
    for _ in range(draw(st.integers(0, 2))):
        request.outputs.add(name=draw(st.sampled_from(["logits", "fetch_name_0", ""])))
    return request

@settings(max_examples=examples, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(requests())
def run(request):
    try:
        stub.ModelInfer(request, timeout=60)
        counts["ok"] += 1
    except grpc.RpcError as exc:
        assert exc.code() in ALLOWED, (exc.code(), exc.details(), request)
        assert "\\n" not in exc.details()

run()
print("answered", counts["ok"])
"""


def test_grpc_model_infer_is_invalid_argument_or_an_answer(served):
    server, port = served
    if not port:
        pytest.skip("the serve and test extras install grpcio")
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(GRPC_FUZZ), f"127.0.0.1:{port}", str(60 * SCALE)],
                         capture_output=True, text=True, cwd=REPO, timeout=patience(300) * SCALE)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Traceback" not in server.err, server.err[-3000:]
