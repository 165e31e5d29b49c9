"""The Open Inference Protocol (KServe v2, Triton's HTTP/REST API): request bodies to arrays, arrays to answers.

An infer request is JSON, optionally followed by raw tensor bytes (the binary
tensor data extension: the JSON's length is the ``Inference-Header-Content-Length``
header, and an input with ``"parameters": {"binary_data_size": n}`` takes its
next ``n`` bytes, row-major, little-endian)::

    {"id": "7", "inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32", "data": [...]}],
     "outputs": [{"name": "logits", "parameters": {"binary_data": true}}]}

The answer names the model and lists every requested output (all of them when
``outputs`` is absent) as ``{"name", "datatype", "shape", "data"}``, or with
``"parameters": {"binary_data_size": n}`` and its bytes after the JSON when the
output asked ``binary_data`` (or the request ``binary_data_output``). Every check
raises :class:`~trainer.deploy.payload.BadRequest` with one line naming the
field (``inputs[0] (input): ...``), answered 400 ``{"error": "..."}``.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .payload import (V2_EXAMPLE, BadRequest, brief, check_finite, has_booleans, json_bytes, parse_json, shape_text,
                      to_array)

DATATYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
             "FP32": "float32", "FP64": "float64"}


MAX_DIMS = 32  # dimensions of a tensor for an input whose shape the export does not give (numpy 1's limit)
MAX_BYTES = 2 ** 63  # no tensor is larger (numpy's bound on an array's bytes, zero dimensions counted as 1)

_BY_DTYPE = {np.dtype(v): k for k, v in DATATYPES.items()}
_DTYPES = {k: np.dtype(v) for k, v in DATATYPES.items()}
_TRAILING = ("the body has %d bytes after the inputs' binary data: send binary_data_size for every binary input and "
             "nothing more")


def datatype(dtype) -> str:
    """The protocol's name of a numpy dtype or dtype name (``float32`` -> ``FP32``)."""
    return _BY_DTYPE.get(np.dtype(dtype), "BYTES")


def tensor_metadata(name: str, dtype: str, shape: Optional[Sequence[int]]) -> dict:
    return {"name": name, "datatype": datatype(dtype), "shape": [int(d) for d in (shape or [-1])]}


class InferRequest:
    """A parsed infer request: the arrays in the model's input order, rows, and what the answer must hold."""

    def __init__(self, arrays: List[np.ndarray], rows: int, request_id: Optional[str], outputs: List[Tuple[str, bool]]):
        self.arrays, self.rows, self.id, self.outputs = arrays, rows, request_id, outputs


def split_body(body: bytes, header_length: Optional[str]) -> Tuple[Any, bytes]:
    """``(the JSON object, the binary tail)`` of a request body (``header_length``: the header's text, or None)."""
    if header_length is None:
        return parse_json(body, V2_EXAMPLE), b""
    n = header_count(header_length)
    if n is None or n > len(body):
        raise BadRequest(f"Inference-Header-Content-Length {brief(header_length)} is not a byte count within the body "
                         f"of {len(body)} bytes: give the length of the JSON part")
    return parse_json(body[:n], V2_EXAMPLE), body[n:]


def parse_infer(obj: Any, tail: bytes, inputs: List[dict], output_names: List[str], max_rows: int,
                allow_nonfinite: bool = False, booleans: bool = True) -> InferRequest:
    """Check a v2 infer request against the model's ``inputs`` spec; BadRequest with one line otherwise.
    ``booleans``: whether a ``data`` list may hold true/false among numbers (``payload.booleans_in`` of the body)."""
    if not isinstance(obj, dict):
        raise BadRequest(f'the body must be a JSON object such as {{"inputs": [{{"name", "shape", "datatype", '
                         f'"data"}}]}}, got a {type(obj).__name__}')
    given = obj.get("inputs")
    if not isinstance(given, list) or not given:
        raise BadRequest('"inputs" must be a non-empty list of {"name", "shape", "datatype", "data"}: the model takes '
                         + ", ".join(f"{s['name']} ({datatype(s['dtype'])})" for s in inputs))
    if len(given) == 1 and len(inputs) == 1 and isinstance(given[0], dict) and given[0].get("name") == inputs[0]["name"]:
        # one tensor for a one-input model (most requests): what the loop and the name checks below conclude
        array, offset = _tensor(given[0], f"inputs[0] ({inputs[0]['name']})", inputs[0], max_rows, tail, 0,
                                booleans)
        if offset != len(tail):
            raise BadRequest(_TRAILING % (len(tail) - offset))
        array = _checked(array, inputs[0], max_rows, allow_nonfinite)
        return InferRequest([array], array.shape[0], _request_id(obj), _outputs(obj, output_names))
    specs = {s["name"]: s for s in inputs}
    seen: Dict[str, None] = {}  # the names in the request's order
    for i, tensor in enumerate(given):  # the names first: a tensor is read against its input's spec
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise BadRequest(f"inputs[{i}]: expected an object with a string \"name\"")
        if tensor["name"] in seen:
            raise BadRequest(f"inputs[{i}] ({brief(tensor['name'])}): the input is given twice")
        seen[tensor["name"]] = None
    names = [s["name"] for s in inputs]
    missing = [n for n in names if n not in seen]
    unknown = [brief(n) for n in seen if n not in specs]
    if missing or unknown:
        raise BadRequest(f"inputs: the model takes inputs {names}; "
                         + "; ".join(p for p in ("missing " + ", ".join(missing) if missing else "",
                                                  "unknown " + ", ".join(unknown) if unknown else "") if p))
    by_name, offset = {}, 0
    for i, tensor in enumerate(given):
        spec = specs[tensor["name"]]
        array, offset = _tensor(tensor, f"inputs[{i}] ({tensor['name']})", spec, max_rows, tail, offset, booleans)
        by_name[tensor["name"]] = array
    if offset != len(tail):
        raise BadRequest(_TRAILING % (len(tail) - offset))
    arrays = [_checked(by_name[spec["name"]], spec, max_rows, allow_nonfinite) for spec in inputs]
    rows = {a.shape[0] for a in arrays}
    if len(rows) > 1:
        raise BadRequest("inputs: every input needs the same first dimension (batch), got "
                         + ", ".join(f"{n}: {a.shape[0]}" for n, a in zip(names, arrays)))
    return InferRequest(arrays, rows.pop(), _request_id(obj), _outputs(obj, output_names))


def _checked(array: np.ndarray, spec: dict, max_rows: int, allow_nonfinite: bool) -> np.ndarray:
    """One input's array checked against its spec (dtype, shape, rows, finite values): what the model takes."""
    field = f"inputs ({spec['name']})"
    if array.dtype != spec["dtype"]:
        raise BadRequest(f"{field}: datatype {datatype(array.dtype)}, the model takes {datatype(spec['dtype'])}")
    array = to_array(array, spec, field, max_rows)
    if not allow_nonfinite:
        check_finite(array, field)
    return array


def _tensor(tensor: dict, field: str, spec: dict, max_rows: int, tail: bytes, offset: int,
            booleans: bool = True) -> Tuple[np.ndarray, int]:
    kind = tensor.get("datatype")
    dtype = _DTYPES.get(kind) if isinstance(kind, str) else None
    if dtype is None:
        raise BadRequest(f"{field}: datatype {brief(kind)} is not served: give one of {', '.join(DATATYPES)}")
    shape = tensor.get("shape")
    count = _count(shape, field, spec, max_rows, dtype.itemsize)
    params = tensor.get("parameters") or {}
    size = params.get("binary_data_size") if isinstance(params, dict) else None
    if size is not None:
        if type(size) is not int or size < 0 or offset + size > len(tail):
            raise BadRequest(f"{field}: binary_data_size {brief(size)} runs past the body's {len(tail)} binary bytes")
        if size != count * dtype.itemsize:
            raise BadRequest(f"{field}: binary_data_size {size} is not shape {shape} x {dtype.itemsize} bytes of "
                             f"{kind} ({count * dtype.itemsize})")
        # read-only, on the body's bytes: nothing writes to a request's arrays (the runtime and a batch copy them)
        array = np.frombuffer(tail, dtype=dtype.newbyteorder("<"), count=count, offset=offset).astype(dtype, copy=False)
        return array.reshape(shape), offset + size
    if "data" not in tensor:
        raise BadRequest(f"{field}: \"data\" is missing (or give parameters.binary_data_size with "
                         "Inference-Header-Content-Length)")
    try:
        raw = np.asarray(tensor["data"])
    except (ValueError, TypeError, RecursionError):
        raise BadRequest(f"{field}: \"data\" is not a regular (flat or nested) list") from None
    if raw.dtype == object or raw.dtype.kind in "USV":
        raise BadRequest(f"{field}: \"data\" holds strings, nulls or mixed types: send {kind} values")
    if raw.size != count:
        raise BadRequest(f"{field}: \"data\" has {raw.size} values, shape {shape} needs {count}")
    if dtype.kind in "iu" and raw.size and raw.dtype.kind not in "iub":
        raise BadRequest(f"{field}: datatype {kind} takes integers, got numbers with a fraction or exponent")
    if dtype.kind == "b" and raw.size and raw.dtype.kind != "b":
        raise BadRequest(f"{field}: datatype BOOL takes true/false")
    if dtype.kind != "b" and (raw.dtype.kind == "b" or booleans and has_booleans(tensor["data"])):
        raise BadRequest(f"{field}: datatype {kind} takes numbers, got true/false")
    if dtype.kind in "iu" and raw.size:
        info = np.iinfo(dtype)
        if raw.min() < info.min or raw.max() > info.max:
            raise BadRequest(f"{field}: a value is out of the range of {kind}")
    with np.errstate(over="ignore"):
        return raw.astype(dtype).reshape(shape), offset


def _count(shape: Any, field: str, spec: dict, max_rows: int, itemsize: int) -> int:
    """The number of values of ``shape`` (a tensor's ``"shape"``), once it is checked against the input's ``spec``:
    sizes as JSON integers >= 0, the input's number of dimensions, 1 to ``max_rows`` rows, and no more than
    :data:`MAX_BYTES` (numpy's limit: a shape such as ``[0, 10**10, 10**10]`` is refused, not allocated)."""
    if type(shape) is not list or not shape or set(map(type, shape)) != {int} or min(shape) < 0:
        raise BadRequest(f"{field}: \"shape\" must be a list of sizes >= 0, e.g. [1, 64], got {brief(shape)}")
    want = spec.get("shape")
    if len(shape) != len(want) if want else len(shape) > MAX_DIMS:
        raise BadRequest(f"{field}: \"shape\" {brief(shape)} has {len(shape)} dimensions, the model's input has "
                         + (f"{len(want)} ({shape_text(want)})" if want else f"at most {MAX_DIMS}"))
    if shape[0] == 0:
        raise BadRequest(f"{field}: the batch is empty (\"shape\" {brief(shape)}): send 1 to {max_rows} instances")
    if shape[0] > max_rows:
        raise BadRequest(f"{field}: {shape[0]} instances in one request (\"shape\" {brief(shape)}), at most "
                         f"{max_rows} (--max_batch_size): split the batch")
    count = math.prod(shape)
    if (count if count else math.prod(d or 1 for d in shape)) * itemsize >= MAX_BYTES:
        raise BadRequest(f"{field}: \"shape\" {brief(shape)} is beyond any tensor's size (its dimensions multiply "
                         "past 2**63 bytes)")
    return count


def header_count(text: str) -> Optional[int]:
    """A header's byte count: ASCII digits only (``str.isdigit`` also takes ``'\\xb2'`` and ``'\\u0662'``, which
    ``int`` refuses or reads), else None."""
    text = text.strip(" \t")
    return int(text) if text and text.isascii() and text.isdigit() else None


def _request_id(obj: dict) -> Optional[str]:
    rid = obj.get("id")
    if rid is None or isinstance(rid, str):
        return rid
    if type(rid) in (int, float):
        return str(rid)
    raise BadRequest(f'"id" must be a string (it is echoed in the answer), got {brief(rid)}')


def _outputs(obj: dict, names: List[str]) -> List[Tuple[str, bool]]:
    params = obj.get("parameters") if isinstance(obj.get("parameters"), dict) else {}
    binary_all = bool(params.get("binary_data_output", False))
    asked = obj.get("outputs")
    if asked is None:
        return [(n, binary_all) for n in names]
    if not isinstance(asked, list):
        raise BadRequest('"outputs" must be a list of {"name", "parameters"}')
    out = []
    for i, item in enumerate(asked):
        name = item.get("name") if isinstance(item, dict) else None
        if name not in names:
            raise BadRequest(f"outputs[{i}]: the model has no output {brief(name)}: it has {', '.join(names)}")
        p = item.get("parameters") if isinstance(item.get("parameters"), dict) else {}
        if p.get("classification"):
            raise BadRequest(f"outputs[{i}] ({name}): the classification extension is not served: ask for the "
                             "tensor")
        out.append((name, bool(p.get("binary_data", binary_all))))
    return out


def infer_response(model: str, version: str, request: InferRequest,
                   outputs: Dict[str, np.ndarray]) -> Tuple[bytes, Optional[bytes]]:
    """``(body, Inference-Header-Content-Length)`` of the answer: JSON, then the binary outputs' bytes when any
    were asked (the header's value is then the JSON's length, else None)."""
    listed, blobs, flat = [], [], []
    for name, binary in request.outputs:
        array = outputs[name]
        entry = {"name": name, "datatype": datatype(array.dtype), "shape": list(array.shape)}
        if binary:
            blob = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = np.ascontiguousarray(array).reshape(-1)
            flat.append(entry["data"])
        listed.append(entry)
    head = {"model_name": model, "model_version": version, "outputs": listed}
    if request.id is not None:
        head["id"] = request.id
    text = json_bytes(head, flat)
    if not blobs:
        return text, None
    return text + b"".join(blobs), b"%d" % len(text)
