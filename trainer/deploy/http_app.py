"""The HTTP API (a Starlette app): ``POST /v1/predict``, ``GET /health``, ``GET /ready``, ``GET /metrics``.

==================  =====================================================================================
status              when
==================  =====================================================================================
200                 ``{"outputs": ...}`` (or the task's rows for ``images`` / ``texts``)
400                 ``{"error": "<one line>"}``: not JSON, a missing field, a wrong shape or dtype, an
                    image that does not decode, too many instances
404 / 405           another path or method
413                 the body is over ``--max_body_bytes``
500                 ``{"error": ...}``: the predictor process died while running the batch (it is restarted),
                    or the runtime failed on it
503                 ``Retry-After: 1``: the queue is full (``--max_queue``), the model is not loaded yet, or the
                    server is draining after SIGTERM/SIGINT
==================  =====================================================================================

The app parses and checks a request in the server's process (the event loop,
or a thread for a task's preprocessing), queues it in the
:class:`~trainer.deploy.batching.Batcher` and answers when its batch is back.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .batching import QueueFull
from .payload import BadRequest, answer, parse_inputs, parse_json
from .pool import WorkerDied


class ServeState:
    """What the routes share: the batcher, the pool, the metrics, limits, the task's preprocessing."""

    def __init__(self, batcher, pool, metrics, max_batch_size: int, max_body_bytes: int, preprocessing=None):
        self.batcher, self.pool, self.metrics = batcher, pool, metrics
        self.max_batch_size, self.max_body_bytes = max_batch_size, max_body_bytes
        self.preprocessing = preprocessing
        self.draining = False
        self.accepted = self.answered = self.refused = 0   # requests to /v1/predict (for the drain report)


def _error(status: int, line: str, retry: bool = False) -> JSONResponse:
    return JSONResponse({"error": line}, status_code=status, headers={"Retry-After": "1"} if retry else None)


async def _read_body(request: Request, limit: int) -> Optional[bytes]:
    """The body, or None when it is over ``limit`` bytes (Content-Length or counted while reading)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(state: ServeState) -> Starlette:
    async def predict(request: Request) -> Response:
        started = time.monotonic()
        response = await _predict(request)
        state.metrics.requests.labels(str(response.status_code)).inc()
        state.metrics.latency.observe(time.monotonic() - started)
        return response

    async def _predict(request: Request) -> Response:
        if state.draining:
            state.refused += 1
            return _error(503, "the server is shutting down: send the request to another replica", retry=True)
        if state.pool.spec is None:  # never loaded (a restart after a crash queues instead)
            return _error(503, "the model is not loaded yet: retry when GET /ready answers 200", retry=True)
        try:
            body = await _read_body(request, state.max_body_bytes)
        except ClientDisconnect:
            return Response(status_code=400)
        if body is None:
            return _error(413, f"the body is over {state.max_body_bytes} bytes (--max_body_bytes): send fewer "
                               "instances per request")
        try:
            obj = parse_json(body)
            arrays, rows, items, pre = await _inputs(obj)
        except BadRequest as exc:
            return _error(400, str(exc))
        try:
            future = state.batcher.submit(arrays, rows)
        except QueueFull as exc:
            return _error(503, f"the server is overloaded: {exc}; retry after Retry-After seconds", retry=True)
        state.accepted += 1
        try:
            outputs = await asyncio.shield(future)
        except WorkerDied as exc:
            state.answered += 1
            return _error(500, str(exc))
        except Exception as exc:  # noqa: BLE001 - a runtime failure on this batch: one line, the server goes on
            state.answered += 1
            return _error(500, f"the model failed on this batch: {exc}")
        state.answered += 1
        if pre is not None:
            try:
                return JSONResponse({"outputs": await run_in_threadpool(pre.decode, outputs, items)})
            except Exception as exc:  # noqa: BLE001
                return _error(500, f"the task's postprocessing failed: {type(exc).__name__}: {exc}")
        return JSONResponse(answer(outputs))

    async def _inputs(obj: Any):
        pre = state.preprocessing
        if pre is not None and isinstance(obj, dict) and pre.field in obj:
            items = obj[pre.field]
            if not isinstance(items, list) or not items:
                raise BadRequest(f"{pre.field}: expected a non-empty list ({pre.description})")
            if len(items) > state.max_batch_size:
                raise BadRequest(f"{pre.field}: {len(items)} items in one request, at most {state.max_batch_size} "
                                 "(--max_batch_size): split the batch")
            try:
                arrays = await run_in_threadpool(pre.encode, items)
            except ValueError as exc:  # DataError/ConfigError are ValueErrors: the task's one line
                raise BadRequest(f"{pre.field}: {exc}") from None
            names = [s["name"] for s in state.pool.spec["inputs"]]
            named = arrays if isinstance(arrays, dict) else dict(zip(names, arrays))
            named = {k: v for k, v in named.items() if k in names}  # what the export takes
            arrays, rows = parse_inputs({"inputs": named},
                                        state.pool.spec["inputs"], state.max_batch_size)
            return arrays, rows, items, pre
        if pre is not None and isinstance(obj, dict) and "inputs" not in obj:
            raise BadRequest(f'send {{"{pre.field}": [...]}} ({pre.description}) or {{"inputs": [...]}} (model inputs)')
        arrays, rows = parse_inputs(obj, state.pool.spec["inputs"], state.max_batch_size)
        return arrays, rows, None, None

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def ready(request: Request) -> Response:
        if state.draining:
            return _error(503, "draining", retry=True)
        if not state.pool.ready:
            return _error(503, "the model is loading", retry=True)
        return JSONResponse({"status": "ready", "inputs": state.pool.spec["inputs"],
                             "outputs": state.pool.spec["outputs"]})

    async def metrics(request: Request) -> Response:
        state.metrics.queue_depth.set(state.batcher.depth)
        state.metrics.ready.set(1 if state.pool.ready and not state.draining else 0)
        return PlainTextResponse(state.metrics.render(), media_type=state.metrics.content_type)

    return Starlette(routes=[Route("/v1/predict", predict, methods=["POST"]), Route("/health", health),
                             Route("/ready", ready), Route("/metrics", metrics)])
