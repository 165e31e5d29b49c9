"""The server's side of the predictor worker processes: start, feed, restart, stop.

``WorkerPool`` runs in the server's asyncio loop. Each worker
(``trainer.deploy.worker``) is a ``spawn`` process with a pipe; the loop reads
the pipe when it is readable (``loop.add_reader``), so no thread waits on a
model. A worker takes one batch at a time: ``await pool.acquire()`` gives an
idle one, ``pool.run(worker, arrays)`` a future of its outputs.

A worker that dies (``kill -9``, a crash in the runtime) is noticed at the end
of its pipe: the batch it held fails with :class:`WorkerDied` (the server
answers its requests 500 with that line) and a new worker is started in its
place. Workers die with the server (``die_with_parent``) and are stopped by
:meth:`WorkerPool.close` (pipe closed, joined, killed after a bound).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import signal
import time
from typing import Any, Dict, List, Optional

from ..errors import TrainerError
from .worker import worker_main

logger = logging.getLogger("trainer.serve")

RESTART_DELAY = 0.5  # s between a worker's death and its replacement, so a model that crashes at once cannot spin


class WorkerDied(RuntimeError):
    """The worker running a batch died before it answered."""


class WorkerFailed(RuntimeError):
    """The runtime raised on a batch (the worker lives on)."""


class ServeStartError(TrainerError):
    """The model could not be loaded or warmed up in a worker."""

    exit_code = 3


class _Worker:
    def __init__(self, index: int, process, conn):
        self.index, self.process, self.conn = index, process, conn
        self.state = "starting"          # starting -> idle <-> busy -> dead
        self.batch: Optional[tuple] = None  # (batch_id, future) in flight
        self.started = time.monotonic()
        self.pid = process.pid


class WorkerPool:
    def __init__(self, options: Dict[str, Any], workers: int = 1, metrics=None):
        self.options = dict(options)
        self.size = workers
        self.metrics = metrics
        self.spec: Optional[dict] = None      # {"inputs": [...], "outputs": [...]} of the first ready worker
        self.restarts = 0
        self.closing = False
        self._ctx = multiprocessing.get_context("spawn")
        self._workers: List[_Worker] = []
        self._idle: Optional[asyncio.Queue] = None
        self._ids = itertools.count(1)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._first: Optional[asyncio.Future] = None

    # ---- lifetime ---------------------------------------------------------------------------
    async def start(self, timeout: float) -> None:
        """Start every worker; return when all are warm; ServeStartError with the worker's line if one fails."""
        self._loop = asyncio.get_running_loop()
        self._idle = asyncio.Queue()
        self._first = self._loop.create_future()
        for index in range(self.size):
            self._spawn(index)
        deadline = time.monotonic() + timeout
        while not all(w.state in ("idle", "busy") for w in self._workers):
            if self._first.done() and self._first.exception() is not None:
                raise self._first.exception()
            if time.monotonic() > deadline:
                raise ServeStartError(f"the model did not load within {timeout:g} s in a predictor process: "
                                      "raise --start_timeout or check the model directory")
            await asyncio.sleep(0.05)

    def _spawn(self, index: int) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=worker_main, args=(child, self.options, os.getpid()),
                                    name=f"ptrain-serve-worker-{index}", daemon=True)
        process.start()
        child.close()
        worker = _Worker(index, process, parent)
        if index < len(self._workers):
            self._workers[index] = worker
        else:
            self._workers.append(worker)
        self._loop.add_reader(parent.fileno(), self._readable, worker)
        return worker

    @property
    def ready(self) -> bool:
        return any(w.state in ("idle", "busy") for w in self._workers)

    @property
    def pids(self) -> List[int]:
        return [w.pid for w in self._workers if w.state != "dead"]

    async def close(self, timeout: float = 5.0) -> None:
        """End every worker: close its pipe (it exits), join, SIGKILL what is left after ``timeout``."""
        self.closing = True
        for worker in self._workers:
            self._drop_reader(worker)
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass
            worker.conn.close()
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            while worker.process.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if worker.process.is_alive():
                worker.process.kill()
            worker.process.join(1.0)
            worker.state = "dead"

    # ---- feeding ----------------------------------------------------------------------------
    async def acquire(self) -> _Worker:
        while True:
            worker = await self._idle.get()
            if worker.state == "idle":
                worker.state = "busy"
                return worker

    def release(self, worker: _Worker) -> None:
        """Give back a worker acquired but not used."""
        if worker.state == "busy":
            worker.state = "idle"
            self._idle.put_nowait(worker)

    def run(self, worker: _Worker, arrays) -> asyncio.Future:
        future = self._loop.create_future()
        batch_id = next(self._ids)
        worker.batch = (batch_id, future)
        try:
            worker.conn.send((batch_id, arrays))
        except (OSError, ValueError, BrokenPipeError):
            self._died(worker)
        return future

    # ---- the pipe ---------------------------------------------------------------------------
    def _drop_reader(self, worker: _Worker) -> None:
        try:
            self._loop.remove_reader(worker.conn.fileno())
        except (OSError, ValueError):
            pass

    def _readable(self, worker: _Worker) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            self._died(worker)
            return
        kind = message[0]
        if kind == "ready":
            worker.state = "idle"
            worker.pid = message[1].get("pid", worker.pid)
            if self.spec is None:
                self.spec = {"inputs": message[1]["inputs"], "outputs": message[1]["outputs"]}
            if self.restarts:  # the first start is announced by the server's ready line
                logger.warning("predictor process %d (pid %d) is ready", worker.index, worker.pid)
            self._idle.put_nowait(worker)
            return
        if kind == "failed":
            error = ServeStartError(f"the predictor process could not load the model: {message[1]}")
            if not self._first.done():
                self._first.set_exception(error)
            else:
                logger.error("%s", error)
            return
        batch_id, status, payload = message
        if worker.batch is None or worker.batch[0] != batch_id:
            return
        _, future = worker.batch
        worker.batch = None
        worker.state = "idle"
        if not future.done():
            if status == "ok":
                future.set_result(payload)
            else:
                future.set_exception(WorkerFailed(payload))
        self._idle.put_nowait(worker)

    def _died(self, worker: _Worker) -> None:
        if worker.state == "dead":
            return
        was = worker.state
        worker.state = "dead"
        self._drop_reader(worker)
        worker.conn.close()
        worker.process.join(0.5)
        code = worker.process.exitcode
        how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exited with code {code}" if code is not None else "stopped answering")
        if worker.batch is not None:
            _, future = worker.batch
            worker.batch = None
            if not future.done():
                future.set_exception(WorkerDied(f"the predictor process (pid {worker.pid}) was {how} while running "
                                                "this batch; it is being restarted, send the request again"))
        if self.closing:
            return
        if was == "starting" and not self._first.done():
            self._first.set_exception(ServeStartError(f"the predictor process (pid {worker.pid}) {how} while "
                                                      "loading the model"))
            return
        self.restarts += 1
        if self.metrics is not None:
            self.metrics.worker_restarts.inc()
        logger.error("predictor process %d (pid %d) %s; starting a new one", worker.index, worker.pid, how)
        self._loop.call_later(RESTART_DELAY, self._respawn, worker.index)

    def _respawn(self, index: int) -> None:
        if not self.closing:
            self._spawn(index)
