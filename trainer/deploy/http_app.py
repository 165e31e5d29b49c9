"""The HTTP API (a Starlette app): the project's ``/v1`` JSON, the Open Inference Protocol ``/v2``, probes, metrics.

====================================================  =================================================================
route                                                 answer
====================================================  =================================================================
``POST /v1/predict``, ``/v1/models/{m}/predict``      ``{"outputs": ...}`` (``/v1/predict``: the first model served)
``GET /health``, ``/v2/health/live``                  200 while the process runs
``GET /ready``, ``/v2/health/ready``                  200 once every predictor process of every model is loaded and warm,
                                                      503 before, while one restarts, and while draining
``GET /v2``                                           server metadata (name, version, extensions)
``GET /v2/models/{m}[/versions/{v}]``                 model metadata: inputs and outputs with datatype and shape
``GET /v2/models/{m}[/versions/{v}]/ready``           200 when that model is ready
``POST /v2/models/{m}[/versions/{v}]/infer``          an infer request, JSON or with binary tensor data (``oip``)
``POST /v2/repository/index`` (or GET)                 every model (READY, or UNAVAILABLE and why) and every folder of a
                                                      model repository not served (UNAVAILABLE, the reason), as Triton
``GET /metrics``                                      Prometheus text format
====================================================  =================================================================

Errors are ``{"error": "<one line>"}`` on every route: 400 (a bad request), 404 (no such model or version),
413 (over ``--max_body_bytes``, or an image over ``--max_image_pixels``), 500 (the predictor process died
while running the batch, or the runtime failed on it), 503 + ``Retry-After: 1`` (the queue is full, the
model is not loaded or cannot be, or the server is draining). Every protocol queues in the model's one
:class:`~trainer.deploy.batching.Batcher`.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from .. import __version__
from .batching import ModelUnavailable, QueueFull
from .oip import header_count, infer_response, parse_infer, split_body
from .payload import BadRequest, answer, booleans_in, parse_inputs, parse_json
from .pool import WorkerDied
from .served import shown

logger = logging.getLogger("trainer.serve")
SERVER_NAME = "ptrain-serve"
EXTENSIONS = ["binary_tensor_data"]


class ServeState:
    """What the routes share: the models (name -> ``ServedModel``, the first is ``/v1/predict``'s), the metrics,
    the limits, the drain accounting."""

    def __init__(self, models: Dict[str, Any], metrics, max_batch_size: int, max_body_bytes: int,
                 allow_nonfinite: bool = False, decode_budget=None, max_image_pixels: int = 40_000_000,
                 skipped: Sequence[Tuple[str, str]] = ()):
        self.models, self.metrics = models, metrics
        self.skipped = list(skipped)  # (folder, reason) of the model repositories' folders not served
        self.max_batch_size, self.max_body_bytes = max_batch_size, max_body_bytes
        self.allow_nonfinite = allow_nonfinite
        self.decode_budget = decode_budget     # a PixelBudget for tasks whose items are images, or None
        self.max_image_pixels = max_image_pixels
        self.draining = False
        self.accepted = self.answered = self.refused = 0   # predict/infer requests (the drain report)
        self.grpc_in_flight = 0  # gRPC ModelInfer calls received and not answered (HTTP's: connections.Guard)

    @property
    def first(self):
        return next(iter(self.models.values()))

    @property
    def ready(self) -> bool:
        return not self.draining and all(m.ready for m in self.models.values())

    def repository_index(self, ready_only: bool = False) -> List[dict]:
        """Triton's repository index: ``{"name", "version", "state", "reason"}`` of every model served (READY, or
        UNAVAILABLE and why) and every repository folder not served (UNAVAILABLE, the reason it was left out)."""
        index = []
        for m in self.models.values():
            ready = m.ready and not self.draining
            index.append({"name": m.name, "version": m.version, "state": "READY" if ready else "UNAVAILABLE",
                          "reason": "" if ready else ("draining" if self.draining else m.pool.status())})
        index += [{"name": shown(folder), "version": "", "state": "UNAVAILABLE", "reason": f"not served: {reason}"}
                  for folder, reason in self.skipped]
        return [e for e in index if e["state"] == "READY"] if ready_only else index


def _error(status: int, line: str, retry: bool = False) -> Response:
    return Response(json.dumps({"error": line}), status_code=status, media_type="application/json",
                    headers={"Retry-After": "1"} if retry else None)


def _json(obj: Any, status: int = 200) -> Response:
    return Response(json.dumps(obj, allow_nan=True, separators=(",", ":")), status_code=status,
                    media_type="application/json")


class _Answer:
    """A 200 answer of the predict/infer routes: the body and its header list, sent as the two ASGI messages.
    Starlette's ``Response`` builds, encodes and sorts out its headers on every request; on a digits request
    that and reading the request's headers through ``Request.headers`` were ~10 us of the server's ~200 (and
    every error still goes through ``Response``)."""

    status_code = 200
    __slots__ = ("body", "raw_headers")

    def __init__(self, body: bytes, content_type: bytes = b"application/json", extra=()):
        self.body = body
        self.raw_headers = [(b"content-length", b"%d" % len(body)), (b"content-type", content_type), *extra]

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body})


def _header(request: Request, name: bytes) -> Optional[str]:
    """A request header's value (``name`` lowercase, as ASGI servers give them), or None."""
    for key, value in request.scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


class _Refused(Exception):
    def __init__(self, response: Response):
        self.response = response


async def _read_body(request: Request, limit: int) -> Optional[bytes]:
    """The body, or None when it is over ``limit`` bytes (Content-Length or counted while reading)."""
    length = _header(request, b"content-length")
    if length is not None and (header_count(length) or 0) > limit:
        return None
    chunks, size = [], 0
    while True:  # the ASGI messages themselves (request.stream() is a generator around this loop)
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def build_app(state: ServeState) -> Starlette:
    def model_of(request: Request):
        name = request.path_params.get("model")
        model = state.first if name is None else state.models.get(name)
        if model is None:
            raise _Refused(_error(404, f"model {name!r} is not served here: GET /v2/models/NAME for one of "
                                       f"{', '.join(state.models)}"))
        version = request.path_params.get("version")
        if version is not None and version != model.version:
            raise _Refused(_error(404, f"model {model.name} has version {model.version} only, not {version!r}"))
        return model

    def endpoint(protocol: str, handler):
        async def route(request: Request) -> Response:
            started = time.monotonic()
            try:
                model = model_of(request)
            except _Refused as exc:
                return exc.response
            if state.draining:
                state.refused += 1
                # read the body first (within --max_body_bytes and --body_timeout): closing with part of it unread
                # in the kernel (a body sent a few ms after its headers) sends a reset, which the client reads
                # instead of this answer
                try:
                    await _read_body(request, state.max_body_bytes)
                except ClientDisconnect:
                    pass
                response = _error(503, "the server is shutting down: send the request to another replica", retry=True)
                response.headers["connection"] = "close"
            else:
                state.accepted += 1   # answered counts the ones that got an answer: the rest were cut
                try:
                    response = await handler(request, model)
                except _Refused as exc:
                    response = exc.response
                except Exception as exc:  # noqa: BLE001 - a bug of ours: one line to the client, the trace logged
                    logger.exception("%s %s failed", request.method, request.url.path)
                    response = _error(500, f"internal error: {type(exc).__name__}: {exc}")
                state.answered += 1
            state.metrics.count(model.name, protocol, response.status_code)
            state.metrics.latency.observe(time.monotonic() - started)
            return response
        return route

    async def body_of(request: Request, model) -> bytes:
        if not model.loaded:  # never loaded (a restart after a crash queues instead)
            raise _Refused(_error(503, f"model {model.name} is not loaded yet: retry when GET /v2/models/"
                                       f"{model.name}/ready answers 200", retry=True))
        try:
            body = await _read_body(request, state.max_body_bytes)
        except ClientDisconnect:
            raise _Refused(Response(status_code=400)) from None
        if body is None:
            raise _Refused(_error(413, f"the body is over {state.max_body_bytes} bytes (--max_body_bytes): send "
                                       "fewer instances per request"))
        return body

    async def run(model, arrays, rows):
        try:
            future = model.batcher.submit(arrays, rows)
        except QueueFull as exc:
            raise _Refused(_error(503, f"the server is overloaded: {exc}; retry after Retry-After seconds",
                                  retry=True)) from None
        except ModelUnavailable as exc:
            raise _Refused(_error(503, str(exc), retry=True)) from None
        try:
            return await future  # answered by the batcher (at once when the model runs in this process)
        except ModelUnavailable as exc:
            raise _Refused(_error(503, str(exc), retry=True)) from None
        except WorkerDied as exc:
            raise _Refused(_error(500, str(exc))) from None
        except Exception as exc:  # noqa: BLE001 - a runtime failure on this batch: one line, the server goes on
            raise _Refused(_error(500, f"the model failed on this batch: {exc}")) from None

    async def predict(request: Request, model) -> Response:
        body = await body_of(request, model)
        try:
            obj = parse_json(body)
            arrays, rows, items, pre = await _inputs(obj, model, booleans_in(body))
        except BadRequest as exc:
            return _error(exc.status, str(exc))
        outputs = await run(model, arrays, rows)
        if pre is not None:
            try:
                return _json({"outputs": await run_in_threadpool(pre.decode, outputs, items)})
            except Exception as exc:  # noqa: BLE001
                return _error(500, f"the task's postprocessing failed: {type(exc).__name__}: {exc}")
        return _Answer(answer(outputs))

    async def _inputs(obj: Any, model, booleans: bool):
        pre, spec = model.preprocessing, model.pool.spec["inputs"]
        if pre is not None and isinstance(obj, dict) and pre.field in obj:
            items = obj[pre.field]
            if not isinstance(items, list) or not items:
                raise BadRequest(f"{pre.field}: expected a non-empty list ({pre.description})")
            if len(items) > state.max_batch_size:
                raise BadRequest(f"{pre.field}: {len(items)} items in one request, at most {state.max_batch_size} "
                                 "(--max_batch_size): split the batch")
            arrays = await _encode(pre, items)
            names = [s["name"] for s in spec]
            named = arrays if isinstance(arrays, dict) else dict(zip(names, arrays))
            named = {k: v for k, v in named.items() if k in names}  # what the export takes
            arrays, rows = parse_inputs({"inputs": named}, spec, state.max_batch_size, state.allow_nonfinite)
            return arrays, rows, items, pre
        if pre is not None and isinstance(obj, dict) and "inputs" not in obj:
            raise BadRequest(f'send {{"{pre.field}": [...]}} ({pre.description}) or {{"inputs": [...]}} (model inputs)')
        arrays, rows = parse_inputs(obj, spec, state.max_batch_size, state.allow_nonfinite, booleans)
        return arrays, rows, None, None

    async def _encode(pre, items):
        try:
            if pre.sizes is None or state.decode_budget is None:
                return await run_in_threadpool(pre.encode, items)
            sizes = await run_in_threadpool(pre.sizes, items)
            for i, (width, height) in enumerate(sizes):
                if width * height > state.max_image_pixels:
                    raise BadRequest(f"item {i}: {width}x{height} = {width * height} pixels, over the limit of "
                                     f"{state.max_image_pixels} per image (--max_image_pixels): send a smaller "
                                     "image", 413)
            async with state.decode_budget.hold(sum(w * h for w, h in sizes)):
                return await run_in_threadpool(pre.encode, items)
        except ValueError as exc:  # DataError/ConfigError/BadRequest are ValueErrors: the task's one line
            raise BadRequest(f"{pre.field}: {exc}", getattr(exc, "status", 400)) from None

    async def infer(request: Request, model) -> Response:
        body = await body_of(request, model)
        try:
            obj, tail = split_body(body, _header(request, b"inference-header-content-length"))
            req = parse_infer(obj, tail, model.pool.spec["inputs"], model.outputs, state.max_batch_size,
                              state.allow_nonfinite, booleans_in(body))
        except BadRequest as exc:
            return _error(exc.status, str(exc))
        outputs = await run(model, req.arrays, req.rows)
        content, header_length = infer_response(model.name, model.version, req, model.named(outputs))
        if header_length is None:
            return _Answer(content)
        return _Answer(content, b"application/octet-stream", ((b"inference-header-content-length", header_length),))

    async def health(request: Request) -> Response:
        return _json({"status": "alive"})

    async def live(request: Request) -> Response:
        return Response(status_code=200)

    async def ready(request: Request) -> Response:
        if state.draining:
            return _error(503, "draining", retry=True)
        waiting = [f"{m.name}: {m.pool.status()}" for m in state.models.values() if not m.ready]
        if waiting:
            return _error(503, "not every predictor process is ready (" + "; ".join(waiting) + ")", retry=True)
        model = state.first
        return _json({"status": "ready", "inputs": model.pool.spec["inputs"], "outputs": model.outputs,
                      "models": {m.name: m.version for m in state.models.values()}})

    async def ready_v2(request: Request) -> Response:
        return Response(status_code=200) if state.ready else (await ready(request))

    async def server_metadata(request: Request) -> Response:
        return _json({"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS})

    async def model_metadata(request: Request) -> Response:
        try:
            model = model_of(request)
        except _Refused as exc:
            return exc.response
        if not model.loaded:
            return _error(503, f"model {model.name} is not loaded yet", retry=True)
        return _json(model.metadata())

    async def model_ready(request: Request) -> Response:
        try:
            model = model_of(request)
        except _Refused as exc:
            return exc.response
        if state.draining or not model.ready:
            return _error(503, f"model {model.name}: " + ("draining" if state.draining else model.pool.status()),
                          retry=True)
        return Response(status_code=200)

    async def repository_index(request: Request) -> Response:
        ready_only = False
        if request.method == "POST":
            body = await _read_body(request, 4096)
            try:
                obj = parse_json(body) if body else {}
            except BadRequest as exc:
                return _error(400, str(exc))
            if not isinstance(obj, dict) or not isinstance(obj.get("ready", False), bool):
                return _error(400, 'the body is {"ready": true|false} (or empty)')
            ready_only = obj.get("ready", False)
        return _json(state.repository_index(ready_only))

    async def metrics(request: Request) -> Response:
        for m in state.models.values():
            state.metrics.queue_depth.labels(m.name).set(m.batcher.depth)
            state.metrics.ready.labels(m.name).set(1 if m.ready and not state.draining else 0)
        return PlainTextResponse(state.metrics.render(), media_type=state.metrics.content_type)

    v1, v2 = endpoint("v1", predict), endpoint("v2", infer)
    routes = [Route("/v1/predict", v1, methods=["POST"]), Route("/v1/models/{model}/predict", v1, methods=["POST"]),
              Route("/health", health), Route("/ready", ready), Route("/metrics", metrics),
              Route("/v2/health/live", live), Route("/v2/health/ready", ready_v2), Route("/v2", server_metadata),
              Route("/v2/repository/index", repository_index, methods=["GET", "POST"])]
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes += [Route(base, model_metadata), Route(base + "/ready", model_ready),
                   Route(base + "/infer", v2, methods=["POST"])]
    return InferFirst(Starlette(routes=routes), v1, v2)


class InferFirst:
    """The ASGI app: ``POST`` to a predict or infer path goes straight to its handler (the same one the router
    names), everything else through Starlette's middleware and router. The middleware (error pages, exception
    handlers, route matching over every route) cost ~50 us a request, as much as the digits model's call: the
    handlers answer every error themselves (``endpoint``), so they need none of it."""

    def __init__(self, app: Starlette, v1, v2):
        self.app, self.v1, self.v2 = app, v1, v2

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler, params = self.hot(scope["path"])
            if handler is not None:
                scope["path_params"] = params
                response = await handler(Request(scope, receive))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def hot(self, path: str):
        """``(handler, path params)`` of a predict/infer path (as the routes above match it), else ``(None, None)``."""
        if path == "/v1/predict":
            return self.v1, {}
        parts = path.split("/")
        if not all(parts[1:]):
            return None, None
        if len(parts) == 5 and parts[1:3] == ["v1", "models"] and parts[4] == "predict":
            return self.v1, {"model": parts[3]}
        if len(parts) == 5 and parts[1:3] == ["v2", "models"] and parts[4] == "infer":
            return self.v2, {"model": parts[3]}
        if len(parts) == 7 and parts[1:3] == ["v2", "models"] and parts[4] == "versions" and parts[6] == "infer":
            return self.v2, {"model": parts[3], "version": parts[5]}
        return None, None
