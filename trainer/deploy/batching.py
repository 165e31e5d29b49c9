"""Dynamic batching: requests wait at most ``max_delay`` to share one model call of up to ``max_batch_size`` rows.

``Batcher.submit(request)`` queues a parsed request (its arrays, its row
count) and returns a future of its own rows of every output; a full queue
(``max_queue`` requests waiting) raises :class:`QueueFull` at once (the server
answers 503 with Retry-After). One asyncio task (:meth:`Batcher.run`) waits
for an idle predictor worker, then for the oldest request's deadline
(``enqueued + max_delay``) or for ``max_batch_size`` rows, whichever comes
first, and sends the batch: the requests in arrival order whose arrays have
the same shapes beyond the batch dimension (texts of different lengths are
not padded together: what a request gets never depends on its neighbours).
While every worker is busy requests pile up, so the next batch is full at
once: batching grows with load by itself.

With a tiny model (``placement``) the batcher also holds the model loaded in the
server process (``inline``): a request that finds the queue empty, the server
quiet and no other request read but unanswered (``in_flight``, counted by the
connections as they are read) runs there at once, with no process hop; under
load requests queue and batch in the predictor processes as above.

Alone, a request does not wait: the batcher waits for more rows only up to the
size of the previous model call, and only if that call was recent (ended within
``IDLE_AFTER`` + ``max_delay`` s). A request that finds an idle worker and a quiet server (the
last call held one request, or was long ago) runs at once; under load the
previous call was full, so the next one waits (at most ``max_delay``) to fill
too. Such a lone request goes from :meth:`Batcher.submit` straight to the idle
worker, without waking the batching task.

A pool that cannot serve (``pool.unavailable``: its predictor processes cannot
load the model) fails the queued requests and refuses new ones with
:class:`ModelUnavailable` and the pool's reason (the server answers 503).
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import Deque, List, Optional, Tuple

import numpy as np


IDLE_AFTER = 0.05  # s since the last model call after which the server counts as quiet (no batch to wait for)


class QueueFull(RuntimeError):
    """``max_queue`` requests are already waiting."""


class ModelUnavailable(RuntimeError):
    """No predictor process can serve the model (the message says why)."""


@dataclass
class Pending:
    arrays: List[np.ndarray]
    rows: int
    future: "asyncio.Future"
    enqueued: float = field(default_factory=time.monotonic)

    @property
    def key(self) -> Tuple:
        return tuple((a.dtype.str, a.shape[1:]) for a in self.arrays)


class Batcher:
    def __init__(self, pool, max_batch_size: int, max_delay: float, max_queue: int, metrics=None, name: str = "model",
                 in_flight=None):
        self.pool, self.name = pool, name
        self.inline = None        # an InlinePool beside the predictor processes: lone requests run in this process
        self.in_flight = in_flight or (lambda: 1)  # requests the server has read and not answered (all models)
        self.max_batch_size = max_batch_size
        self.max_delay = max_delay
        self.max_queue = max_queue
        self.metrics = metrics
        self._queue: Deque[Pending] = collections.deque()
        self._arrived: Optional[asyncio.Event] = None
        self._inflight = set()
        self._task: Optional[asyncio.Task] = None
        self._last_rows, self._last_at = 0, 0.0   # the previous model call: rows and when it was sent
        if hasattr(pool, "listeners"):
            pool.listeners.append(self.fail_all)

    @property
    def depth(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        self._arrived = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self.run())

    def submit(self, arrays: List[np.ndarray], rows: int, inline: bool = True) -> "asyncio.Future":
        """The request's outputs (a future). ``inline``: the protocol counts every request it has read in
        ``in_flight`` (HTTP: uvicorn reads every ready connection before any handler runs), so a request that
        sees none besides itself may run in this process (:attr:`inline`). grpc.aio hands the server one call
        per turn of the event loop, so a call run inline at once (which holds the loop) never sees the next ones
        (every call ran alone: mean batch 1.0 at 32 concurrent clients): gRPC passes True only for a call still
        alone after one more turn (``grpc_app``)."""
        reason = getattr(self.pool, "unavailable", None)
        if reason:
            raise ModelUnavailable(reason)
        if len(self._queue) >= self.max_queue:
            raise QueueFull(f"{len(self._queue)} requests are waiting (--max_queue {self.max_queue})")
        pending = Pending(arrays, rows, asyncio.get_running_loop().create_future())
        if not self._queue and self._quiet(pending.enqueued):  # alone: straight to an idle worker, no hop
            if inline and self.inline is not None and self.in_flight() <= 1:
                self._here(pending)  # nobody else waits to be read: run it here, no process hop
                return pending.future
            worker = self.pool.try_acquire() if hasattr(self.pool, "try_acquire") else None
            if worker is not None:
                self._send(worker, [pending])
                return pending.future
        self._queue.append(pending)
        self._arrived.set()
        if self.metrics is not None:
            self.metrics.queue_depth.labels(self.name).set(len(self._queue))
        return pending.future

    async def run(self) -> None:
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            worker = await self.pool.acquire()
            want = 1 if self._quiet(time.monotonic()) else min(self.max_batch_size, self._last_rows)
            while self._queue:  # wait for the oldest's deadline or a batch as full as the last one
                head = self._queue[0]
                left = head.enqueued + self.max_delay - time.monotonic()
                if left <= 0 or self._rows_like(head) >= want:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except asyncio.TimeoutError:
                    break
            batch = self._take()
            if not batch:
                self.pool.release(worker)
                continue
            self._send(worker, batch)

    def _rows_like(self, head: Pending) -> int:
        key, rows = head.key, 0
        for p in self._queue:
            if p.key == key:
                rows += p.rows
                if rows >= self.max_batch_size:
                    break
        return rows

    def _take(self) -> List[Pending]:
        while self._queue and self._queue[0].future.done():  # the client went away (cancelled)
            self._queue.popleft()
        if not self._queue:
            return []
        key = self._queue[0].key
        batch, rows, keep = [], 0, collections.deque()
        while self._queue:
            p = self._queue.popleft()
            if p.future.done():
                continue
            if p.key == key and (not batch or rows + p.rows <= self.max_batch_size):
                batch.append(p)
                rows += p.rows
            else:
                keep.append(p)
            if rows >= self.max_batch_size:
                break
        keep.extend(self._queue)
        self._queue = keep
        if self.metrics is not None:
            self.metrics.queue_depth.labels(self.name).set(len(self._queue))
        return batch

    def _quiet(self, now: float) -> bool:
        """No batch to wait for: the last model call held one request, or ended long enough ago."""
        return self._last_rows <= 1 or now - self._last_at >= IDLE_AFTER + self.max_delay

    def _send(self, worker, batch: List[Pending]) -> None:
        """Send ``batch`` to ``worker``, one of :attr:`pool`'s, now (with ``--workers 0``, in this process); its
        requests' futures are answered when the outputs come back. A lone request run here beside the predictor
        processes goes through :meth:`_here` instead."""
        arrays = [np.concatenate([p.arrays[i] for p in batch]) if len(batch) > 1 else batch[0].arrays[i]
                  for i in range(len(batch[0].arrays))]
        rows = sum(p.rows for p in batch)
        self._last_rows, self._last_at = rows, time.monotonic()
        if self.metrics is not None:
            self.metrics.batch_size.observe(rows)
        future = self.pool.run(worker, arrays, lambda done: self._deliver(done, batch, rows))
        if not future.done():
            self._inflight.add(future)

    def _here(self, pending: Pending) -> None:
        """Run a lone request in this process now (:attr:`inline`, whose calls end before the next request is
        read, so it is never busy) and answer its future: what :meth:`_send` and :meth:`_deliver` do for a batch
        of one, without the worker hand-off (~15 us of a digits request's ~190 in the server)."""
        rows = pending.rows
        self._last_rows = rows
        if self.metrics is not None:
            self.metrics.batch_size.observe(rows)
        try:
            outputs = self.inline.call(pending.arrays)
        except RuntimeError as exc:  # the runtime's one line (500); the server goes on
            pending.future.set_exception(exc)
        else:
            bad = _bad_rows(outputs, rows)
            pending.future.set_exception(RuntimeError(bad)) if bad else pending.future.set_result(outputs)
        self._last_at = time.monotonic()

    def _deliver(self, done: "asyncio.Future", batch: List[Pending], rows: int) -> None:
        self._inflight.discard(done)
        self._last_at = time.monotonic()  # quiet is counted from the call's end: a slow model is not "idle"
        if done.cancelled() or done.exception() is not None:
            exc = RuntimeError("the model call was cancelled") if done.cancelled() else done.exception()
            for p in batch:  # every request of the batch gets the error
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        outputs = done.result()
        bad = _bad_rows(outputs, rows)
        start = 0
        for p in batch:
            if p.future.done():
                start += p.rows
                continue
            if bad:
                p.future.set_exception(RuntimeError(bad))
            else:
                p.future.set_result([o[start:start + p.rows] for o in outputs])
            start += p.rows

    def fail_all(self, reason: str) -> None:
        """Answer every queued request with ModelUnavailable(reason) (the pool cannot serve)."""
        while self._queue:
            p = self._queue.popleft()
            if not p.future.done():
                p.future.set_exception(ModelUnavailable(reason))

    async def drain(self, timeout: float) -> None:
        """Wait until nothing is queued or in flight (at most ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while (self._queue or self._inflight) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _bad_rows(outputs: List[np.ndarray], rows: int) -> Optional[str]:
    """The line for outputs that do not hold one row per input row (a model that cannot be batched), else None."""
    for o in outputs:
        if not o.shape or o.shape[0] != rows:
            return (f"the model returned outputs of shapes {[o.shape for o in outputs]} for a batch of {rows} "
                    "rows: it must return one row per input row to be served")
    return None
