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

One model, one set of files: each worker reports the fingerprint (sha256) of
the model files it loaded; the first one is the pool's, and a replacement
is told it and refuses to load anything else (a directory changed while
serving: one line in the log, the slot stays empty and is retried with a
back-off up to 30 s). When no worker can serve (every slot refused or failed
to load, or a restart did not load within the start timeout), the pool is
``unavailable`` with the reason: queued and new requests answer 503 with it.
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
MAX_RESTART_DELAY = 30.0  # the back-off's bound for a slot whose replacements keep failing to load


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
        self.state = "starting"          # starting -> idle <-> busy -> dead; starting -> failed (a replacement)
        self.batch: Optional[tuple] = None  # (batch_id, future) in flight
        self.started = time.monotonic()
        self.pid = process.pid
        self.fingerprint: Optional[str] = None


class WorkerPool:
    def __init__(self, options: Dict[str, Any], workers: int = 1, metrics=None, start_timeout: float = 300.0):
        self.options = dict(options)
        self.start_timeout = start_timeout
        self.fingerprint: Optional[str] = None   # of the files the first worker loaded; every worker must match
        self.unavailable: Optional[str] = None   # why no worker can serve (None: one can, or will soon)
        self.listeners: List[Any] = []           # called with the reason when the pool becomes unavailable
        self._failures: Dict[int, int] = {}      # slot -> consecutive failed starts (the back-off)
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
        self._first.set_result(None)  # from here a worker that cannot load is a replacement's failure
        prints = {w.fingerprint for w in self._workers}
        if len(prints) > 1:
            raise ServeStartError(f"the predictor processes loaded different files ({len(prints)} fingerprints): "
                                  "the model directory changed while the server started; start it again")
        self.fingerprint = prints.pop()
        self.options["fingerprint"] = self.fingerprint  # replacements refuse any other files

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
        if self.fingerprint is not None:  # a replacement: bounded like the first start
            self._loop.call_later(self.start_timeout, self._start_overdue, worker)
        return worker

    @property
    def ready(self) -> bool:
        """Every worker is loaded and warm (what ``/ready`` answers)."""
        return bool(self._workers) and all(w.state in ("idle", "busy") for w in self._workers)

    def status(self) -> str:
        """One phrase for ``/ready``: ``2 of 2 predictor processes ready``, or why not."""
        up = sum(w.state in ("idle", "busy") for w in self._workers)
        text = f"{up} of {self.size} predictor processes ready"
        return text + (f"; {self.unavailable}" if self.unavailable else "")

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
            worker.process.join(max(0.1, min(1.0, deadline + 0.5 - time.monotonic())))
            worker.state = "dead"

    # ---- feeding ----------------------------------------------------------------------------
    async def acquire(self) -> _Worker:
        while True:
            worker = await self._idle.get()
            if worker.state == "idle":
                worker.state = "busy"
                return worker

    def try_acquire(self) -> Optional[_Worker]:
        """An idle worker now, or None (never waits)."""
        while not self._idle.empty():
            worker = self._idle.get_nowait()
            if worker.state == "idle":
                worker.state = "busy"
                return worker
        return None

    def release(self, worker: _Worker) -> None:
        """Give back a worker acquired but not used."""
        if worker.state == "busy":
            worker.state = "idle"
            self._idle.put_nowait(worker)

    def run(self, worker: _Worker, arrays, done=None) -> asyncio.Future:
        """A future of ``worker``'s outputs for ``arrays``; ``done(future)``, if given, is called the moment it is
        answered (in the pipe's reader: a done-callback would run one event-loop turn later)."""
        future = self._loop.create_future()
        batch_id = next(self._ids)
        worker.batch = (batch_id, future, done)
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
            worker.fingerprint = message[1].get("fingerprint")
            self._failures.pop(worker.index, None)
            if self.unavailable is not None:
                logger.warning("model %s can be served again", self.options.get("name", ""))
            self.unavailable = None
            if self.spec is None:
                self.spec = {k: message[1].get(k) for k in ("inputs", "outputs", "output_specs", "call_ms")}
            if self.restarts:  # the first start is announced by the server's ready line
                logger.warning("predictor process %d (pid %d) is ready", worker.index, worker.pid)
            self._idle.put_nowait(worker)
            return
        if kind == "failed":
            error = ServeStartError(f"the predictor process could not load the model: {message[1]}")
            if not self._first.done():
                self._first.set_exception(error)
            else:
                worker.state = "failed"
                self._refused(worker, message[1])
            return
        batch_id, status, payload = message
        if worker.batch is None or worker.batch[0] != batch_id:
            return
        _, future, done = worker.batch
        worker.batch = None
        worker.state = "idle"
        self._idle.put_nowait(worker)
        if not future.done():
            if status == "ok":
                future.set_result(payload)
            else:
                future.set_exception(WorkerFailed(payload))
            if done is not None:
                done(future)

    def _start_overdue(self, worker: _Worker) -> None:
        if worker.state == "starting" and not self.closing:
            worker.state = "failed"
            self._refused(worker, f"did not load within {self.start_timeout:g} s (--start_timeout)")
            worker.process.kill()

    def _refused(self, worker: _Worker, reason: str) -> None:
        """A replacement could not take its slot: log it, back off, and mark the pool unavailable if no worker
        serves."""
        failures = self._failures[worker.index] = self._failures.get(worker.index, 0) + 1
        delay = min(MAX_RESTART_DELAY, RESTART_DELAY * 2 ** failures)
        self._drop_reader(worker)
        worker.conn.close()
        if not any(w.state in ("idle", "busy") for w in self._workers):
            self.unavailable = f"no predictor process can load the model: {reason}"
            for listener in self.listeners:
                listener(self.unavailable)
        if failures == 1 or failures % 10 == 0:
            logger.error("predictor process %d (pid %d) cannot load the model: %s; retrying every %.0f s at most",
                         worker.index, worker.pid, reason, delay)
        self._loop.call_later(delay, self._respawn, worker.index)

    def _died(self, worker: _Worker) -> None:
        if worker.state in ("dead", "failed"):
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
            _, future, done = worker.batch
            worker.batch = None
            if not future.done():
                future.set_exception(WorkerDied(f"the predictor process (pid {worker.pid}) was {how} while running "
                                                "this batch; it is being restarted, send the request again"))
                if done is not None:
                    done(future)
        if self.closing:
            return
        if was == "starting" and not self._first.done():
            self._first.set_exception(ServeStartError(f"the predictor process (pid {worker.pid}) {how} while "
                                                      "loading the model"))
            return
        if was == "starting":  # a replacement that cannot load: back off rather than spin
            worker.state = "failed"
            self._refused(worker, f"the process {how} while loading it")
            return
        self.restarts += 1
        if self.metrics is not None:
            self.metrics.worker_restarts.inc()
        logger.error("predictor process %d (pid %d) %s; starting a new one", worker.index, worker.pid, how)
        self._loop.call_later(RESTART_DELAY, self._respawn, worker.index)

    def _respawn(self, index: int) -> None:
        if not self.closing and self._workers[index].state in ("dead", "failed"):
            old = self._workers[index]
            if old.process.is_alive():
                old.process.kill()
            old.process.join(0.5)
            self._spawn(index)
