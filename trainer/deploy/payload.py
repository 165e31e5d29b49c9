"""Request bodies to model inputs, model outputs to answers, and the one-line error of a bad request.

``POST /v1/predict`` takes JSON:

- ``{"inputs": [...]}``: a batch of instances for a model with one input
  (``[[...64 numbers...], ...]`` for digits);
- ``{"inputs": {"name": [...], ...}}``: one batch per input name;
- with a task's preprocessing (``Preprocessing``), its field instead
  (``{"images": [base64, ...]}``, ``{"texts": [...]}``).

Every check names the field and what is expected (:class:`BadRequest`, answered
400): JSON, the field, nesting and shape against the export's input spec
(``-1`` is any size), dtype (integers for integer inputs, numbers for float
ones), one batch size across inputs, 1 to ``max_batch_size`` rows. Answers are
``{"outputs": rows}`` for one output, ``{"outputs": [rows, ...]}`` for several.

JSON is read and written by ``orjson`` when it is installed (the ``serve``
extra: ~10x faster than ``json`` on a digits request, whose parse cost more
than the model), by ``json`` otherwise and wherever ``orjson`` is stricter:
bodies with ``NaN``, ``Infinity`` or ``1e309`` (``json`` reads them, and
:func:`check_finite` names them), non-finite outputs (written ``NaN`` /
``Infinity``, where ``orjson`` would write ``null``), and dtypes it does not
take (float16).
"""

from __future__ import annotations

import json
import reprlib
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

try:
    import orjson
except ImportError:  # the serve extra installs it; without it json does everything, slower
    orjson = None

_ORJSON_DTYPES = frozenset(np.dtype(t) for t in ("float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                                                  "uint16", "uint32", "uint64", "bool"))


_BRIEF = reprlib.Repr()
_BRIEF.maxlist, _BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlong, _BRIEF.maxdict = 8, 40, 40, 40, 4


def brief(value: Any) -> str:
    """``repr(value)`` cut short, for a value the client sent echoed in a one-line answer (a shape of 10**6
    dimensions is not sent back whole; a name holding a newline is escaped)."""
    return _BRIEF.repr(value)


class BadRequest(ValueError):
    """A request the server cannot run: the message is the one line of the answer (``status``: 400, or 413 for
    a request over a size limit)."""

    def __init__(self, line: str, status: int = 400):
        super().__init__(line)
        self.status = status


#: what a body of each protocol looks like, for the line that refuses one that is not JSON
V1_EXAMPLE = '{"inputs": [[...], ...]}'
V2_EXAMPLE = '{"inputs": [{"name": ..., "shape": [...], "datatype": "FP32", "data": [...]}]}'


def parse_json(body: bytes, example: str = V1_EXAMPLE) -> Any:
    if not body:
        raise BadRequest(f"the body is empty: send JSON such as {example}")
    if orjson is not None:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass  # NaN, Infinity, 1e309 (json reads them: check_finite names them), or not JSON: json says where
    try:
        return json.loads(body)
    except (UnicodeDecodeError, RecursionError):
        raise BadRequest("the body is not UTF-8 JSON (or is nested too deeply): send JSON") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the body is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): send JSON such "
                         f"as {example}") from None


def shape_text(shape: Optional[Sequence[int]]) -> str:
    if not shape:
        return "[N, ...]"
    return "[" + ", ".join("N" if i == 0 else ("any" if d < 0 else str(d)) for i, d in enumerate(shape)) + "]"


class _Expect:
    """What an input takes (``[N, 64] of numbers``), written out only when a message needs it."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype

    def __format__(self, spec: str) -> str:
        kind = "integers" if self.dtype.kind in "iu" else "booleans" if self.dtype.kind == "b" else "numbers"
        return f"{shape_text(self.shape)} of {kind}"


def booleans_in(body: bytes) -> bool:
    """Whether a JSON ``body`` may hold a ``true``/``false`` (a search of its bytes: the lists are walked only then).
    First one byte each (memchr: 0.4 us on a digits body, where the words cost 2 us); most bodies hold neither."""
    return (b"r" in body or b"f" in body) and (b"true" in body or b"false" in body)


def has_booleans(value: Any) -> bool:
    """Whether a nested list holds a JSON ``true``/``false``: numpy reads one among numbers as 1 or 0."""
    if type(value) is not list:
        return type(value) is bool
    if value and type(value[0]) is list:
        return any(has_booleans(v) for v in value)
    return bool in set(map(type, value))


def to_array(value: Any, spec: dict, field: str, max_rows: int, booleans: bool = True) -> np.ndarray:
    """One input's batch as an array of the spec's dtype and shape, else BadRequest naming ``field``.
    ``booleans``: whether ``value`` may hold true/false among numbers (:func:`booleans_in` of the body)."""
    dtype, shape = np.dtype(spec["dtype"]), spec.get("shape")
    if isinstance(value, np.ndarray) and value.dtype == dtype and shape and value.ndim == len(shape) \
            and 0 < value.shape[0] <= max_rows and all(w < 0 or g == w for g, w in zip(value.shape[1:], shape[1:])):
        return np.ascontiguousarray(value)  # already what the model takes (a binary v2 tensor, a task's arrays)
    expect = _Expect(shape, dtype)
    if not isinstance(value, (list, np.ndarray)):  # arrays: from a task's preprocessing
        raise BadRequest(f"{field}: expected a list of instances (a batch, shape {expect}), got {type(value).__name__}")
    if len(value) == 0:
        raise BadRequest(f"{field}: the batch is empty: send 1 to {max_rows} instances")
    try:
        raw = np.asarray(value)
    except (ValueError, TypeError, RecursionError):
        raise BadRequest(f"{field}: the instances are not a regular nested list (ragged rows?): expected {expect}") from None
    if raw.dtype == object or raw.dtype.kind in "USV":
        what = "strings" if raw.dtype.kind in "US" else "mixed types or integers beyond 64 bits"
        raise BadRequest(f"{field}: expected {expect}, got {what}")
    if dtype.kind in "iu" and raw.dtype.kind not in "iub":
        raise BadRequest(f"{field}: expected integers (the model's input is {dtype.name}), got numbers with a fraction "
                         "or exponent")
    if dtype.kind == "b" and raw.dtype.kind != "b":
        raise BadRequest(f"{field}: expected true/false (the model's input is bool), got {raw.dtype.kind} values")
    if dtype.kind != "b" and (raw.dtype.kind == "b" or booleans and has_booleans(value)):
        raise BadRequest(f"{field}: expected {expect}, got true/false (the model's input is {dtype.name})")
    if shape:
        if raw.ndim != len(shape):
            raise BadRequest(f"{field}: expected shape {expect}, got {list(raw.shape)} ({raw.ndim} dimensions, the "
                             f"model takes {len(shape)})")
        for i, (got, want) in enumerate(zip(raw.shape[1:], shape[1:]), start=1):
            if want >= 0 and got != want:
                raise BadRequest(f"{field}: expected shape {expect}, got {list(raw.shape)} (dimension {i} must be {want})")
    if raw.ndim == 0:
        raise BadRequest(f"{field}: expected a list of instances of shape {expect}")
    if raw.shape[0] > max_rows:
        raise BadRequest(f"{field}: {raw.shape[0]} instances in one request, at most {max_rows} (--max_batch_size): "
                         "split the batch")
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if raw.size and (raw.min() < info.min or raw.max() > info.max):
            raise BadRequest(f"{field}: a value is out of the range of {dtype.name}")
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(raw.astype(dtype, copy=False))


def check_finite(array: np.ndarray, field: str) -> None:
    """BadRequest naming ``field`` when a float input holds NaN or an infinity (``NaN``, ``Infinity``, ``1e309``, or
    a number beyond the dtype's range such as ``1e39`` for float32): a model answers those with plausible numbers."""
    if array.dtype.kind != "f" or not array.size:
        return
    finite = np.isfinite(array)
    if finite.all():
        return
    where = tuple(int(i) for i in np.argwhere(~finite)[0])
    bad = array[where]
    what = "NaN" if np.isnan(bad) else f"{'-' if bad < 0 else ''}Infinity (or beyond {array.dtype.name}'s range)"
    raise BadRequest(f"{field}: value at {list(where)} is {what}: send finite numbers (ptrain serve "
                     "--allow_nonfinite passes them to the model)")


def parse_inputs(body: Any, inputs: List[dict], max_rows: int, allow_nonfinite: bool = False,
                 booleans: bool = True) -> Tuple[List[np.ndarray], int]:
    """``(arrays in the spec's order, rows)`` of a ``{"inputs": ...}`` body, else BadRequest (``booleans``: as
    :func:`to_array`'s)."""
    if not isinstance(body, dict):
        raise BadRequest(f'the body must be a JSON object such as {{"inputs": [...]}}, got a {type(body).__name__}')
    if "inputs" not in body:
        raise BadRequest(f'the field "inputs" is missing: send {{"inputs": [...]}} (a batch{_one_or_named(inputs)})')
    value = body["inputs"]
    names = [s["name"] for s in inputs]
    if isinstance(value, dict):
        missing = [n for n in names if n not in value]
        unknown = [brief(k) for k in value if k not in names]
        if missing or unknown:
            raise BadRequest(f"inputs: the model takes inputs {names}; "
                             + ("missing " + ", ".join(missing) if missing else "")
                             + ("; " if missing and unknown else "")
                             + ("unknown " + ", ".join(unknown) if unknown else ""))
        arrays = [to_array(value[s["name"]], s, f"inputs.{s['name']}", max_rows, booleans) for s in inputs]
    elif len(inputs) > 1:
        raise BadRequest(f"inputs: the model takes {len(inputs)} inputs {names}: send "
                         '{"inputs": {"' + names[0] + '": [...], ...}}')
    else:
        arrays = [to_array(value, inputs[0], "inputs", max_rows, booleans)]
    if not allow_nonfinite:
        for s, a in zip(inputs, arrays):
            check_finite(a, "inputs" if isinstance(value, list) else f"inputs.{s['name']}")
    rows = {a.shape[0] for a in arrays}
    if len(rows) > 1:
        raise BadRequest("inputs: every input needs the same number of instances, got "
                         + ", ".join(f"{n}: {a.shape[0]}" for n, a in zip(names, arrays)))
    return arrays, rows.pop()


def _one_or_named(inputs: List[dict]) -> str:
    if len(inputs) == 1:
        return f" of instances, shape {shape_text(inputs[0].get('shape'))}"
    return ", or an object of one batch per input: " + ", ".join(s["name"] for s in inputs)


def answer(outputs: List[np.ndarray]) -> bytes:
    """``{"outputs": rows}`` for one output, ``{"outputs": [rows per output]}`` for several, as JSON bytes (a
    non-finite output is written ``NaN`` / ``Infinity``, as Python's and rapidjson's parsers read it)."""
    return json_bytes({"outputs": outputs[0] if len(outputs) == 1 else list(outputs)}, outputs)


def json_bytes(obj: Any, arrays: Sequence[np.ndarray]) -> bytes:
    """``obj`` (which holds the numpy ``arrays``) as compact JSON bytes; non-finite floats as ``NaN`` / ``Infinity``."""
    if orjson is not None and all(a.dtype in _ORJSON_DTYPES and a.flags.c_contiguous for a in arrays):
        text = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
        if b"null" not in text:  # orjson writes a non-finite float as null: then json writes it (rare, slower)
            return text
    return json.dumps(obj, default=_listed, allow_nan=True, separators=(",", ":")).encode()


def _listed(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")
