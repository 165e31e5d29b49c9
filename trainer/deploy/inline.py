"""``--workers 0``: the model runs in the server's own process, in its event loop, as a hand-written server does.

For models whose call takes well under a millisecond (the digits MLP): a
predictor process costs two process wake-ups and a pickled round trip per
batch, more than the model itself. Here a batch runs where it is formed, with
no hop: while it runs (``paddle.inference`` holds the GIL) the server parses
nothing else, which is why this is only for tiny models. A request finds the
model free (it ran to completion before the next request was parsed), so it
runs alone: batches form only with predictor processes. Everything else (v1/v2,
limits, drain) is the same. :class:`InlinePool` offers what
:class:`~trainer.deploy.pool.WorkerPool` offers the batcher and the routes;
the model is loaded once at start (with the same fingerprint and warm-up),
and nothing restarts it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any, Dict, List, Optional

from .pool import ServeStartError
from .worker import first_line, load_checked


class InlinePool:
    size = 1

    def __init__(self, options: Dict[str, Any], metrics=None, start_timeout: float = 300.0):
        self.options = dict(options)
        self.start_timeout = start_timeout
        self.spec: Optional[dict] = None
        self.fingerprint: Optional[str] = None
        self.unavailable: Optional[str] = None
        self.listeners: List[Any] = []
        self.restarts = 0
        self._runtime = None
        self._idle: Optional[asyncio.Queue] = None

    async def start(self, timeout: float) -> None:
        self._idle = asyncio.Queue()
        started = time.monotonic()
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._runtime, info = load_checked(self.options)  # blocks the loop: nothing is served before it
        except Exception as exc:  # noqa: BLE001 - the server exits 3 with the line
            raise ServeStartError(f"the model could not be loaded in the server process: {first_line(exc)}") from None
        finally:  # paddle installs its own SIGTERM/SIGINT handlers when it loads: the server's drain keeps them
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        if time.monotonic() - started > timeout:
            raise ServeStartError(f"the model did not load within {timeout:g} s: raise --start_timeout or check the "
                                  "model directory")
        self.fingerprint = info["fingerprint"]
        self.spec = {k: info.get(k) for k in ("inputs", "outputs", "output_specs", "call_ms")}
        self._idle.put_nowait(self)

    @property
    def ready(self) -> bool:
        return self._runtime is not None

    def status(self) -> str:
        return "loaded in the server process" if self.ready else "loading in the server process"

    @property
    def pids(self) -> List[int]:
        return [os.getpid()]

    async def acquire(self):
        return await self._idle.get()

    def try_acquire(self):
        return None if self._idle.empty() else self._idle.get_nowait()

    def release(self, worker) -> None:
        self._idle.put_nowait(self)

    def run(self, worker, arrays, done=None) -> "asyncio.Future":
        """The outputs for ``arrays``, computed now (a done future); ``done(future)`` is called before returning."""
        future = asyncio.get_running_loop().create_future()
        try:
            future.set_result(self.call(arrays))
        except RuntimeError as exc:
            future.set_exception(exc)
        self._idle.put_nowait(self)
        if done is not None:
            done(future)
        return future

    def call(self, arrays) -> List[Any]:
        """The outputs for ``arrays``, computed now; a runtime failure is a RuntimeError with its first line."""
        try:
            return self._runtime.run(arrays)
        except Exception as exc:  # noqa: BLE001 - the batch's requests get the line (500); the server goes on
            raise RuntimeError(first_line(exc)) from None

    async def close(self, timeout: float = 5.0) -> None:
        self._runtime = None
