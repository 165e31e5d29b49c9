"""The Open Inference Protocol over gRPC (KServe v2, Triton's ``inference.GRPCInferenceService``): ``--grpc_port``.

A ``grpc.aio`` server in the HTTP server's event loop, with the service's
compiled messages from ``tritonclient.grpc`` (the ``serve`` extra). Every call
goes through what HTTP v2 uses: a model's one batcher, ``oip.parse_infer``'s
checks and one-line messages, the same names, readiness and drain accounting.

=====================  ==============================================================================================
call                   answer
=====================  ==============================================================================================
``ServerLive``         ``live: true`` while the process runs
``ServerReady``        ``ready``: every predictor of every model loaded and warm, and not draining (``/ready``)
``ModelReady``         ``ready`` of that model (NOT_FOUND: no such model or version)
``ServerMetadata``     name ``ptrain-serve``, version, extensions
``ModelMetadata``      inputs and outputs with datatype and shape (UNAVAILABLE until loaded)
``ModelInfer``         inputs in ``raw_input_contents`` (little-endian, row-major) or typed ``contents``; every
                       asked output (all when none is asked) in ``raw_output_contents``, as Triton answers
``RepositoryIndex``    every model (READY, or UNAVAILABLE and why) and every repository folder not served, as
                       ``/v2/repository/index``
=====================  ==============================================================================================

Status codes: INVALID_ARGUMENT (a bad request: the HTTP 400 line), NOT_FOUND (no such model or version),
RESOURCE_EXHAUSTED (the model's queue is full, or a message over ``--max_body_bytes``), UNAVAILABLE (not loaded,
cannot load, or draining), INTERNAL (the predictor died on the batch or the runtime failed on it, or a bug of the
server's: its traceback is logged). No input the client controls gives UNKNOWN or a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Optional, Tuple

import numpy as np

from .. import __version__
from ..errors import ConfigError
from .batching import ModelUnavailable, QueueFull
from .http_app import EXTENSIONS, SERVER_NAME
from .oip import DATATYPES, datatype, parse_infer
from .payload import BadRequest, brief
from .pool import WorkerDied

logger = logging.getLogger("trainer.serve")
GRPC_EXTRA = 'pip install -e ".[serve]" in the paddle-trainer checkout (grpcio and tritonclient\'s compiled protocol)'

#: the typed ``contents`` field of each datatype (FP16 has none: send it in raw_input_contents)
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
            "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents"}
_READ_AS = {"bool_contents": np.bool_, "int_contents": np.int64, "int64_contents": np.int64,
            "uint_contents": np.uint64, "uint64_contents": np.uint64, "fp32_contents": np.float32,
            "fp64_contents": np.float64}


def grpc_modules():
    """``(grpc, service_pb2, service_pb2_grpc)``; ConfigError naming the extra when they are not installed."""
    try:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc
    except ImportError as exc:
        raise ConfigError(f"--grpc_port needs {exc.name or 'grpcio'}: {GRPC_EXTRA}") from None
    return grpc, service_pb2, service_pb2_grpc


class _Abort(Exception):
    """An answer other than OK: the HTTP status it matches (for the metrics), the gRPC code's name, one line."""

    def __init__(self, status: int, code: str, line: str):
        super().__init__(line)
        self.status, self.code, self.line = status, code, line


def request_dict(request) -> Tuple[dict, bytes]:
    """``(a v2 JSON-like request, the binary tail)`` of a ModelInferRequest: ``oip.parse_infer`` checks both."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise BadRequest(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs: send every "
                         "input there, or none (typed contents)")
    inputs = []
    for i, tensor in enumerate(request.inputs):
        item = {"name": tensor.name, "shape": list(tensor.shape), "datatype": tensor.datatype}
        if raw:
            item["parameters"] = {"binary_data_size": len(raw[i])}
        elif tensor.datatype in CONTENTS:
            field = CONTENTS[tensor.datatype]
            values = getattr(tensor.contents, field)
            item["data"] = np.fromiter(values, dtype=_READ_AS[field], count=len(values))
        elif tensor.datatype in DATATYPES:
            raise BadRequest(f"inputs[{i}] ({tensor.name}): datatype {tensor.datatype} has no typed contents: send "
                             "it in raw_input_contents")
        inputs.append(item)
    obj = {"inputs": inputs}
    if request.id:
        obj["id"] = request.id
    if request.outputs:
        obj["outputs"] = [{"name": o.name} for o in request.outputs]
    return obj, b"".join(raw)


class Servicer:
    """The calls of ``inference.GRPCInferenceService`` this server answers (the rest: UNIMPLEMENTED)."""

    def __init__(self, state, grpc, pb):
        self.state, self.grpc, self.pb = state, grpc, pb

    def _model(self, name: str, version: str):
        model = self.state.models.get(name)
        if model is None:
            raise _Abort(404, "NOT_FOUND", f"model {brief(name)} is not served here: one of "
                                           f"{', '.join(self.state.models)}")
        if version and version != model.version:
            raise _Abort(404, "NOT_FOUND", f"model {model.name} has version {model.version} only, not {brief(version)}")
        return model

    async def ServerLive(self, request, context):
        return self.pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return self.pb.ServerReadyResponse(ready=self.state.ready)

    async def ModelReady(self, request, context):
        model = await self._or_abort(context, self._model, request.name, request.version)
        return self.pb.ModelReadyResponse(ready=not self.state.draining and model.ready)

    async def ServerMetadata(self, request, context):
        return self.pb.ServerMetadataResponse(name=SERVER_NAME, version=__version__, extensions=EXTENSIONS)

    async def ModelMetadata(self, request, context):
        model = await self._or_abort(context, self._model, request.name, request.version)
        if not model.loaded:
            await context.abort(self._code("UNAVAILABLE"), f"model {model.name} is not loaded yet")
        meta = model.metadata()
        tensors = [[self.pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta[k]] for k in ("inputs", "outputs")]
        return self.pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                                             inputs=tensors[0], outputs=tensors[1])

    async def RepositoryIndex(self, request, context):
        models = [self.pb.RepositoryIndexResponse.ModelIndex(**e) for e in self.state.repository_index(request.ready)]
        return self.pb.RepositoryIndexResponse(models=models)

    async def ModelInfer(self, request, context):
        started, state, model = time.monotonic(), self.state, None
        try:
            model = self._model(request.model_name, request.model_version)
            if state.draining:
                state.refused += 1
                raise _Abort(503, "UNAVAILABLE", "the server is shutting down: send the request to another replica")
            state.accepted += 1
            state.grpc_in_flight += 1  # other calls see it: a call that is not alone waits to be batched
            try:
                response = await self._infer(request, model)
            except _Abort:
                raise
            except Exception as exc:  # noqa: BLE001 - a bug of ours: one line to the client, the trace logged
                logger.exception("ModelInfer of %s failed", model.name)
                raise _Abort(500, "INTERNAL", f"internal error: {type(exc).__name__}: {exc}") from None
            finally:
                state.answered += 1
                state.grpc_in_flight -= 1
            status = 200
        except _Abort as exc:
            status, response = exc.status, exc
        if model is not None:
            state.metrics.count(model.name, "grpc", status)
            state.metrics.latency.observe(time.monotonic() - started)
        if isinstance(response, _Abort):
            await context.abort(self._code(response.code), response.line)
        return response

    async def _infer(self, request, model):
        if not model.loaded:
            raise _Abort(503, "UNAVAILABLE", f"model {model.name} is not loaded yet: retry when ModelReady answers "
                                             "ready")
        try:
            obj, tail = request_dict(request)
            req = parse_infer(obj, tail, model.pool.spec["inputs"], model.outputs, self.state.max_batch_size,
                              self.state.allow_nonfinite, booleans=False)  # typed contents: numbers only
        except BadRequest as exc:
            raise _Abort(exc.status, "INVALID_ARGUMENT" if exc.status == 400 else "RESOURCE_EXHAUSTED",
                         str(exc)) from None
        inline = False
        if model.batcher.inline is not None and self.state.grpc_in_flight == 1:
            # grpc.aio starts one call per turn of the event loop: a call run in this process at once (which holds
            # the loop) never sees the calls behind it, and under load every call ran alone (mean batch 1.0). After
            # one more turn the calls that had arrived with it have started: only one still alone runs here.
            await asyncio.sleep(0)
            inline = True  # the batcher runs it here only if nothing else is read, queued or in flight
        try:
            outputs = model.named(await model.batcher.submit(req.arrays, req.rows, inline=inline))
        except QueueFull as exc:
            raise _Abort(503, "RESOURCE_EXHAUSTED", f"the server is overloaded: {exc}; retry later") from None
        except ModelUnavailable as exc:
            raise _Abort(503, "UNAVAILABLE", str(exc)) from None
        except WorkerDied as exc:
            raise _Abort(500, "INTERNAL", str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - a runtime failure on this batch: one line, the server goes on
            raise _Abort(500, "INTERNAL", f"the model failed on this batch: {exc}") from None
        answer = self.pb.ModelInferResponse(model_name=model.name, model_version=model.version, id=req.id or "")
        for name, _binary in req.outputs:
            array = np.ascontiguousarray(outputs[name])
            answer.outputs.add(name=name, datatype=datatype(array.dtype), shape=list(array.shape))
            answer.raw_output_contents.append(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
        return answer

    async def _or_abort(self, context, call, *args):
        try:
            return call(*args)
        except _Abort as exc:
            await context.abort(self._code(exc.code), exc.line)

    def _code(self, name: str):
        return getattr(self.grpc.StatusCode, name)


async def start_grpc(state, host: str, port: int, max_message_bytes: int) -> Tuple[object, int]:
    """Start the gRPC server on ``host:port`` in the running loop; ``(server, port)``. ConfigError if it cannot bind."""
    grpc, pb, pb_grpc = grpc_modules()
    try:  # first with a socket of ours: gRPC's own failure to bind logs lines of its own beside ours
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise ConfigError(f"--host {host} --grpc_port {port}: cannot listen there ({exc.strerror}): give another "
                          "--grpc_port or an address of this machine") from None
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_message_bytes),
                                      ("grpc.max_send_message_length", -1), ("grpc.so_reuseport", 0)])
    servicer = type("GRPCInferenceService", (Servicer, pb_grpc.GRPCInferenceServiceServicer), {})(state, grpc, pb)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound: Optional[int]
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if not bound:
        raise ConfigError(f"--host {host} --grpc_port {port}: cannot listen there: give another --grpc_port or an "
                          "address of this machine")
    await server.start()
    return server, bound
