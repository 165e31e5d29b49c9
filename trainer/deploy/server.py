"""``serve(config)``: an exported model behind uvicorn, with dynamic batching in predictor processes.

::

    from trainer.deploy.server import ServeConfig, serve
    serve(ServeConfig("runs/digits-demo/inference", port=8000))   # until SIGTERM / SIGINT; returns the exit code

What runs: one server process (uvicorn with the guarded h11 protocol of
``trainer.deploy.connections``, the Starlette app of ``trainer.deploy.http_app``,
one :class:`~trainer.deploy.batching.Batcher` per model) and ``workers``
predictor processes per model (``trainer.deploy.worker``) that die with it. It
prints ``ptrain serve: ready on http://HOST:PORT ...`` once every worker of
every model has loaded and warmed up (``GET /ready`` answers 200 from then on).
With ``grpc_port``, a ``grpc.aio`` server (``trainer.deploy.grpc_app``) serves the
Open Inference Protocol over gRPC in the same event loop, through the same batchers.

Stopping: SIGTERM or SIGINT marks the server draining: every new request
(on a new or a kept-alive connection) answers 503 with ``Connection: close``,
while the requests already accepted are answered. Once they are (or at
``drain_timeout`` less a reserve for the shutdown itself), the connections
waiting in the listening socket's backlog are taken, the socket closes (new
connections are refused from then on), the ones taken get 503, the workers stop and the process
returns 0 within ``drain_timeout`` seconds of the signal (gRPC calls: UNAVAILABLE while draining, the gRPC
server stopped with the HTTP one). It prints how many
requests were accepted, answered, refused and cut; requests cut at the bound
make the exit code 1. A second SIGINT exits at once (1). A model that cannot
load: exit 3 with the worker's line.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Union

from ..errors import ConfigError
from .batching import Batcher
from .connections import LINGER, Guard, guarded_protocol, refuse_backlog
from .grpc_app import grpc_modules, start_grpc
from .http_app import ServeState, build_app
from .inline import InlinePool
from .limits import PixelBudget
from .metrics import ServeMetrics
from .placement import INLINE_MAX_MS, place
from .pool import ServeStartError, WorkerPool
from .runtimes import RUNTIMES
from .served import ServedModel, check_name, find_models, skipped_line


@dataclass
class ServeConfig:
    model_dir: Union[str, Sequence[str]]   # DIR, NAME=DIR, a model repository folder, or a list of them
    model_prefix: Optional[str] = None
    host: str = "127.0.0.1"
    port: int = 8000                  # 0: any free port (the ready line says which)
    max_batch_size: int = 32
    max_delay_ms: float = 5.0
    max_queue: Optional[int] = None   # requests waiting per model; None: 16 x max_batch_size x workers
    workers: Optional[int] = None     # predictor processes per model; 0: the model runs in the server process;
    #                                   None: 1, and lone requests in this process under inline_max_ms (placement)
    device: str = "cpu"
    runtime: str = "paddle"
    threads: int = 1                  # CPU math threads per predictor process
    max_body_bytes: int = 16 << 20
    drain_timeout: float = 30.0
    start_timeout: float = 300.0
    model_name: Optional[str] = None      # one model only; several: NAME=DIR
    model_version: str = "1"
    output_names: Optional[Sequence[str]] = None
    allow_nonfinite: bool = False
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: Optional[int] = None  # None: the open-file soft limit less a reserve (at most 8192)
    max_image_pixels: int = 40_000_000
    max_decode_pixels: Optional[int] = None  # None: 2 x max_image_pixels
    inline_max_ms: float = INLINE_MAX_MS     # with workers None: a model whose call is shorter runs lone requests here
    grpc_port: int = 0                       # the Open Inference Protocol over gRPC on this port too; 0: off

    def check(self) -> "ServeConfig":
        """Validate every field (ConfigError naming the flag); returns self."""
        for flag, value, low in (("--max_batch_size", self.max_batch_size, 1), ("--workers", self.workers, 0),
                                 ("--threads", self.threads, 1), ("--max_body_bytes", self.max_body_bytes, 64),
                                 ("--max_image_pixels", self.max_image_pixels, 1)):
            if value is None and flag == "--workers":
                continue
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"{flag} {value} is not allowed: give an integer >= {low}")
        for flag, value in (("--max_queue", self.max_queue), ("--max_connections", self.max_connections),
                            ("--max_decode_pixels", self.max_decode_pixels)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{flag} {value} is not allowed: give an integer >= 1")
        if not 0 <= self.inline_max_ms <= 10_000:
            raise ConfigError(f"--inline_max_ms {self.inline_max_ms} is not allowed: give 0 (never) to 10000 "
                              "milliseconds")
        if not 0 <= self.max_delay_ms <= 10_000:
            raise ConfigError(f"--max_delay_ms {self.max_delay_ms} is not allowed: give 0 to 10000 milliseconds")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port} is not allowed: give 0 (any free port) to 65535")
        if not isinstance(self.grpc_port, int) or not 0 <= self.grpc_port <= 65535:
            raise ConfigError(f"--grpc_port {self.grpc_port} is not allowed: give 0 (off) or a port up to 65535")
        if self.grpc_port:
            grpc_modules()  # ConfigError naming the extra
        for flag, value in (("--drain_timeout", self.drain_timeout), ("--start_timeout", self.start_timeout),
                            ("--header_timeout", self.header_timeout), ("--body_timeout", self.body_timeout)):
            if not value > 0:
                raise ConfigError(f"{flag} {value} is not allowed: give a number of seconds > 0")
        if self.runtime not in RUNTIMES:
            raise ConfigError(f"--runtime {self.runtime} is not known: give one of {', '.join(RUNTIMES)}")
        if not re.fullmatch(r"cpu|gpu(:\d+)?", self.device):
            raise ConfigError(f"--device {self.device} is not allowed: give cpu or gpu:K")
        check_name("--model_version", self.model_version)
        self.models, self.skipped = find_models(self.model_dir, self.model_prefix, self.model_name, self.model_version)
        if self.max_queue is None:
            self.max_queue = 16 * self.max_batch_size * max(1, self.workers or 1)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        soft = soft if 0 < soft < 1 << 20 else 1 << 20
        # asyncio accepts up to `backlog` sockets per turn of its loop and counts each (connection_made) two turns
        # later, while the ones refused or evicted at the limit close a turn after that: a loop slowed by a busy
        # machine holds up to ~3 bursts uncounted. 4 bursts of files in reserve: accept() never meets EMFILE.
        self.backlog = max(16, min(1024, soft // 16))
        if self.max_connections is None:
            processes = 4 * (self.workers or 1) * len(self.models)  # their pipes
            self.max_connections = max(16, min(8192, soft - 64 - 4 * self.backlog - processes))
        if self.max_decode_pixels is None:
            self.max_decode_pixels = 2 * self.max_image_pixels
        return self


def _say(line: str) -> None:
    print(f"ptrain serve: {line}", file=sys.stderr, flush=True)


def serve(config: ServeConfig, preprocessing=None, tasks: Optional[Callable] = None) -> int:
    """Serve until SIGTERM/SIGINT; return the exit code (see the module docstring).

    ``tasks(model_dir)`` -> ``(Preprocessing or None, output names or None)`` of the task an export names
    (``ptrain serve`` passes one that reads the task registry); ``preprocessing``: a task's ``Preprocessing``
    (``field``, ``encode``, ``decode``, ``description``) for a single model, without ``tasks``."""
    config.check()
    if config.skipped:  # before anything loads: a folder left out is said once, with why
        _say(f"warning: not serving {len(config.skipped)} folder(s) of the model repository: "
             f"{skipped_line(config.skipped)}; GET /v2/repository/index lists them")
    return asyncio.run(_serve(config, tasks or (lambda _dir: (preprocessing, None))))


def _models(config: ServeConfig, metrics, tasks, in_flight) -> Dict[str, ServedModel]:
    models = {}
    for name, version, model_dir in config.models:
        preprocessing, task_outputs = tasks(model_dir)
        options = {"name": name, "model_dir": os.path.abspath(model_dir), "prefix": config.model_prefix,
                   "runtime": config.runtime, "device": config.device, "threads": config.threads,
                   "max_batch_size": config.max_batch_size}
        pool = (InlinePool(options, metrics, config.start_timeout) if config.workers == 0
                else WorkerPool(options, config.workers or 1, metrics, config.start_timeout))
        batcher = Batcher(pool, config.max_batch_size, config.max_delay_ms / 1000.0, config.max_queue, metrics, name,
                          in_flight)
        models[name] = ServedModel(name, version, model_dir, pool, batcher,
                                   "onnxruntime_onnx" if config.runtime == "onnxruntime" else "paddle_inference",
                                   preprocessing, config.output_names, task_outputs)
    return models


async def _serve(config: ServeConfig, tasks) -> int:
    import uvicorn

    metrics = ServeMetrics(config.max_batch_size)
    guard = Guard(config.header_timeout, config.body_timeout, config.max_connections, metrics)
    # gRPC calls in flight count as load too (the batcher's inline choice); read at request time, once state exists
    models = _models(config, metrics, tasks, lambda: guard.requests + state.grpc_in_flight)
    state = ServeState(models, metrics, config.max_batch_size, config.max_body_bytes, config.allow_nonfinite,
                       PixelBudget(config.max_decode_pixels), config.max_image_pixels, config.skipped)
    try:
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY on accepted sockets only then (else Nagle + delayed ACK
        # add 40 ms to every answer on a kept-alive connection)
        sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET, socket.SOCK_STREAM,
                             socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((config.host, config.port))
    except OSError as exc:
        raise ConfigError(f"--host {config.host} --port {config.port}: cannot listen there ({exc.strerror}): give "
                          "another --port (0: any free one) or an address of this machine") from None
    server = _Server(uvicorn.Config(build_app(state), host=config.host, port=config.port, log_level="warning",
                                    lifespan="off", timeout_graceful_shutdown=config.drain_timeout,
                                    access_log=False, http=guarded_protocol(guard), backlog=config.backlog,
                                    proxy_headers=False),  # no X-Forwarded-For rewriting: nothing reads the client
                     state, sock)
    port = sock.getsockname()[1]
    for model in models.values():
        model.batcher.start()
    serving = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    grpc_server = None
    try:
        try:
            if config.grpc_port:
                grpc_server, _ = await start_grpc(state, config.host, config.grpc_port, config.max_body_bytes)
            await asyncio.gather(*(m.pool.start(config.start_timeout) for m in models.values()))
            for model in models.values():
                line = await place(model, config.workers, config.device, config.inline_max_ms, metrics)
                if line:
                    _say(line)
                model.bind()
        except (ServeStartError, ConfigError) as exc:
            server.should_exit = True
            await serving
            _say(f"error: {exc}")
            return exc.exit_code
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        inline = ", ".join(m.name + ("" if isinstance(m.pool, InlinePool) else ": lone requests")
                           for m in models.values() if isinstance(m.pool, InlinePool) or m.inline is not None)
        processes = sum(m.pool.size for m in models.values() if not isinstance(m.pool, InlinePool))
        print(f"ptrain serve: ready on http://{config.host}:{port} (POST /v1/predict, /v2/models/NAME/infer; GET "
              "/health /ready /metrics /v2/health/ready); "
              + "; ".join(f"model {m.name} version {m.version} ({m.model_dir})" for m in models.values())
              + f"; runtime {config.runtime}, {processes} predictor process(es)"
              + (f" ({inline} in the server process)" if inline else "") + " pid "
              f"{','.join(str(p) for m in models.values() for p in m.pool.pids)}, max_batch_size "
              f"{config.max_batch_size}, max_delay_ms {config.max_delay_ms:g}, max_queue {config.max_queue}, "
              f"max_connections {config.max_connections}"
              + (f"; gRPC on {config.host}:{config.grpc_port}" if grpc_server else ""), flush=True)
        await serving
    finally:
        if grpc_server is not None:  # its accepted calls were answered in the drain (the accounting is shared)
            await grpc_server.stop(min(1.0, max(0.1, server.deadline - time.monotonic())) if server.deadline else 0.1)
        for model in models.values():
            model.batcher.stop()
        left = max(0.5, server.deadline - time.monotonic()) if server.deadline else 5.0
        await asyncio.gather(*(m.pool.close(left) for m in models.values()),
                             *(m.inline.close() for m in models.values() if m.inline is not None))
    if server.signal_name is None:
        return 0
    cut = state.accepted - state.answered
    _say(f"{server.signal_name} received: {state.accepted} requests accepted, {state.answered} answered, "
         f"{state.refused} refused while draining (503), {cut} cut at --drain_timeout {config.drain_timeout:g} s"
         f"; {server.backlog} waiting connections and {server.idle_closed} open ones without a request answered 503"
         f"; predictor processes stopped in {time.monotonic() - server.signalled:.1f} s; "
         f"exit {1 if cut else 0}")
    return 1 if cut else 0


def _Server(config, state, sock):
    """uvicorn's Server with our signal handling and drain: refuse new requests (503) while the accepted ones are
    answered, answer the backlog 503 before the listening socket closes, and exit with our code (uvicorn re-raises
    the signal after a graceful stop, which would end the process with 143/130)."""
    import uvicorn

    drain_timeout = config.timeout_graceful_shutdown

    class Server(uvicorn.Server):
        signal_name: Optional[str] = None
        deadline: Optional[float] = None
        signalled = 0.0
        backlog = idle_closed = 0

        @contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        def on_signal(self, signum, frame):
            if self.signal_name is not None and signum == signal.SIGINT:
                _say("second SIGINT: exiting now, unanswered requests are cut; exit 1")
                os._exit(1)
            if self.signal_name is not None:
                return
            self.signal_name = signal.Signals(signum).name
            self.signalled = time.monotonic()
            self.deadline = self.signalled + drain_timeout
            _say(f"{self.signal_name}: draining (new requests get 503; answering the accepted ones, at most "
                 f"{drain_timeout:g} s)")
            state.draining = True
            asyncio.get_running_loop().create_task(self._drain())

        async def _drain(self):
            reserve = min(3.0, 0.3 * drain_timeout)  # for closing connections, stopping the predictors, exiting
            while state.accepted > state.answered and time.monotonic() < self.deadline - reserve:
                await asyncio.sleep(0.01)
            self.config.timeout_graceful_shutdown = max(0.1, self.deadline - reserve / 2 - time.monotonic())
            self.should_exit = True

        async def shutdown(self, sockets=None):
            line = "the server is shutting down: send the request to another replica"
            seals, taken = refuse_backlog(sock, line)
            for listening in self.servers:  # stop listening now, not after the idle connections below: a connection
                listening.close()           # that reached the backlog meanwhile would be reset when it closes
            for seal in seals:
                seal.close()
            self.backlog = taken.answer(line).answered  # read until their clients close, beside the rest of shutdown
            for conn in list(self.server_state.connections):  # a request may be on its way: 503, never a reset
                if getattr(conn, "waiting_for_headers", lambda: False)():
                    self.idle_closed += 1
                    conn.refuse_and_linger(line)
            await super().shutdown(sockets)
            left = LINGER if self.deadline is None else min(LINGER, self.deadline - time.monotonic())
            await asyncio.get_running_loop().run_in_executor(None, taken.join, left)

    return Server(config)
