"""``serve(config)``: an exported model behind uvicorn, with dynamic batching in predictor processes.

::

    from trainer.deploy.server import ServeConfig, serve
    serve(ServeConfig("runs/digits-demo/inference", port=8000))   # until SIGTERM / SIGINT; returns the exit code

What runs: one server process (uvicorn + the Starlette app of
``trainer.deploy.http_app``, the :class:`~trainer.deploy.batching.Batcher`)
and ``workers`` predictor processes (``trainer.deploy.worker``) that die with
it. It prints ``ptrain serve: ready on http://HOST:PORT ...`` once every
worker has loaded and warmed up the model (``GET /ready`` answers 200 from
then on).

Stopping: SIGTERM or SIGINT stops accepting (the listening socket closes, a
request on a kept-alive connection gets 503), answers every request already
accepted, stops the workers and returns 0 within ``drain_timeout`` seconds; it
prints how many requests were accepted, answered and refused. Requests still
unanswered at the bound are cut and the exit code is 1. A second SIGINT exits
at once (1). A model that cannot load: exit 3 with the worker's line.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

from ..errors import ConfigError
from .batching import Batcher
from .http_app import ServeState, build_app
from .metrics import ServeMetrics
from .pool import ServeStartError, WorkerPool
from .predictor import model_files
from .runtimes import RUNTIMES


@dataclass
class ServeConfig:
    model_dir: str
    model_prefix: Optional[str] = None
    host: str = "127.0.0.1"
    port: int = 8000                  # 0: any free port (the ready line says which)
    max_batch_size: int = 32
    max_delay_ms: float = 5.0
    max_queue: Optional[int] = None   # requests waiting; None: 16 x max_batch_size x workers
    workers: int = 1
    device: str = "cpu"
    runtime: str = "paddle"
    threads: int = 1                  # CPU math threads per predictor process
    max_body_bytes: int = 16 << 20
    drain_timeout: float = 30.0
    start_timeout: float = 300.0

    def check(self) -> "ServeConfig":
        """Validate every field (ConfigError naming the flag); returns self."""
        for flag, value, low in (("--max_batch_size", self.max_batch_size, 1), ("--workers", self.workers, 1),
                                 ("--threads", self.threads, 1), ("--max_body_bytes", self.max_body_bytes, 64)):
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"{flag} {value} is not allowed: give an integer >= {low}")
        if self.max_queue is not None and (not isinstance(self.max_queue, int) or self.max_queue < 1):
            raise ConfigError(f"--max_queue {self.max_queue} is not allowed: give an integer >= 1")
        if not 0 <= self.max_delay_ms <= 10_000:
            raise ConfigError(f"--max_delay_ms {self.max_delay_ms} is not allowed: give 0 to 10000 milliseconds")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port} is not allowed: give 0 (any free port) to 65535")
        if self.drain_timeout <= 0 or self.start_timeout <= 0:
            raise ConfigError("--drain_timeout and --start_timeout must be > 0 seconds")
        if self.runtime not in RUNTIMES:
            raise ConfigError(f"--runtime {self.runtime} is not known: give one of {', '.join(RUNTIMES)}")
        if not re.fullmatch(r"cpu|gpu(:\d+)?", self.device):
            raise ConfigError(f"--device {self.device} is not allowed: give cpu or gpu:K")
        if not os.path.isdir(self.model_dir):
            raise ConfigError(f"MODEL_DIR {self.model_dir} does not exist: give the directory of an exported model "
                              "(OUTPUT_DIR/inference of a finished run)")
        model_files(self.model_dir, self.model_prefix)  # DataError naming what is missing
        if self.max_queue is None:
            self.max_queue = 16 * self.max_batch_size * self.workers
        return self


def _say(line: str) -> None:
    print(f"ptrain serve: {line}", file=sys.stderr, flush=True)


def serve(config: ServeConfig, preprocessing=None) -> int:
    """Serve until SIGTERM/SIGINT; return the exit code (see the module docstring). ``preprocessing``: a
    task's ``Preprocessing`` (``field``, ``encode``, ``decode``, ``description``) for ``images`` / ``texts``."""
    config.check()
    return asyncio.run(_serve(config, preprocessing))


async def _serve(config: ServeConfig, preprocessing) -> int:
    import uvicorn

    metrics = ServeMetrics(config.max_batch_size)
    options = {"model_dir": os.path.abspath(config.model_dir), "prefix": config.model_prefix,
               "runtime": config.runtime, "device": config.device, "threads": config.threads,
               "max_batch_size": config.max_batch_size}
    pool = WorkerPool(options, config.workers, metrics)
    batcher = Batcher(pool, config.max_batch_size, config.max_delay_ms / 1000.0, config.max_queue, metrics)
    state = ServeState(batcher, pool, metrics, config.max_batch_size, config.max_body_bytes, preprocessing)
    server = _Server(uvicorn.Config(build_app(state), host=config.host, port=config.port, log_level="warning",
                                    lifespan="off", timeout_graceful_shutdown=config.drain_timeout,
                                    access_log=False), state)
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
    port = sock.getsockname()[1]
    batcher.start()
    serving = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    try:
        try:
            await pool.start(config.start_timeout)
        except ServeStartError as exc:
            server.should_exit = True
            await serving
            _say(f"error: {exc}")
            return exc.exit_code
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        metrics.ready.set(1)
        print(f"ptrain serve: ready on http://{config.host}:{port} (POST /v1/predict, GET /health /ready /metrics); "
              f"model {config.model_dir}, runtime {config.runtime}, {config.workers} predictor process(es) pid "
              f"{','.join(map(str, pool.pids))}, max_batch_size {config.max_batch_size}, max_delay_ms "
              f"{config.max_delay_ms:g}, max_queue {config.max_queue}", flush=True)
        await serving
        await batcher.drain(1.0)
    finally:
        batcher.stop()
        await pool.close()
    if server.signal_name is None:
        return 0
    left = state.accepted - state.answered
    _say(f"{server.signal_name} received: stopped accepting; {state.accepted} requests accepted, {state.answered} "
         f"answered, {state.refused} refused while draining" + (f", {left} cut at --drain_timeout "
                                                                f"{config.drain_timeout:g} s" if left else "")
         + f"; predictor processes stopped; exit {1 if left else 0}")
    return 1 if left else 0


def _Server(config, state):
    """uvicorn's Server with our signal handling: stop accepting, mark the app draining, and exit with our
    code (uvicorn re-raises the signal after a graceful stop, which would end the process with 143/130)."""
    import uvicorn

    class Server(uvicorn.Server):
        signal_name: Optional[str] = None

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
            if self.signal_name is None:
                self.signal_name = signal.Signals(signum).name
                _say(f"{self.signal_name}: draining (no new requests; answering the accepted ones, at most "
                     f"{config.timeout_graceful_shutdown:g} s)")
            state.draining = True
            self.should_exit = True

    return Server(config)
