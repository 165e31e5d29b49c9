"""Reading the next batches in a thread while the step runs, without changing what is trained or resumed.

A hand-written loop over ``paddle.io.DataLoader(num_workers=0)`` already builds
its next batch in a reader thread, on a free core, while the step computes.
:class:`ReadAhead` does the same for the in-process loader, and keeps the two
guarantees of building batches in the training thread:

- **The dataset's own exception is raised at its step**, in the training
  thread, with its traceback (it is handed over, not printed by the thread).
- **The RNG states saved at a step boundary resume the data exactly.** A
  batch is read ahead only while fetching batches draws from no global RNG.
  The first batch of each iterator is fetched in the calling thread and
  checked against python's, numpy's and paddle's generators; if it drew
  from any of them, every batch is fetched in the calling thread, when the
  step needs it, as without read-ahead. The thread checks python's and
  numpy's global RNGs around every batch it fetches: the first batch that
  drew ends the read-ahead, and :meth:`ReadAhead.settle` (called before a
  checkpoint is taken) puts the RNGs back to where they were before that
  batch and fetches it again after the save, so the saved states are those
  of a run that never read ahead. (paddle's generator is checked only in
  the first batch: the step's dropout draws from it at the same time.)

One fetch runs at a time in the process (:data:`FETCH_LOCK`): a dataset
object shared by the training and the evaluation loaders is never entered
from two threads at once. ``__getitem__`` code that the training thread
also touches while a step runs (rare) must be thread-safe;
``dataloader_read_ahead=True`` turns it on (it is off by default: it pays for a dataset that waits on
files or C code, not for in-memory data and a CPU-bound step).
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Iterator, List, Optional

from .host_rng import full_host_rng_state, host_rng_state, paddle_rng_state, set_host_rng_state

#: Held by every fetch a :class:`ReadAhead` makes, in its thread or in the caller's.
FETCH_LOCK = threading.RLock()

_END = "end"
_BATCH = "batch"
_ERROR = "error"
_INLINE = "inline"  # the thread saw the RNGs move between its fetches: the caller fetches from now on


class _Item:
    __slots__ = ("kind", "value", "indices", "drew_from")

    def __init__(self, kind: str, value: Any = None, indices: Optional[list] = None):
        self.kind, self.value, self.indices = kind, value, indices
        self.drew_from: Optional[tuple] = None  # the RNG states before this batch drew from them


class _Channel:
    """What the thread and the caller share (the thread holds this, not the :class:`ReadAhead`,
    so an iterator its caller drops is collected, and its ``__del__`` ends the thread)."""

    def __init__(self, depth: int):
        self.cond = threading.Condition()
        self.ready: collections.deque = collections.deque()
        self.depth = depth
        self.stop = False

    def put(self, item: _Item) -> None:
        with self.cond:
            self.ready.append(item)
            self.cond.notify_all()

    def end(self) -> None:
        with self.cond:
            self.stop = True
            self.cond.notify_all()


class ReadAhead:
    """The batches of ``fetch(indices)`` for each ``indices`` of ``batches``, in order, up to
    ``depth`` of them fetched ahead by a daemon thread (see the module's docstring for when).

    ``fetch`` returns a batch or raises; ``convert`` (e.g. numpy to tensors) runs where the batch
    is fetched when ``convert_in_thread``, else in the caller's thread when the batch is handed out.
    ``thread_init`` runs first in the thread (the loader sets paddle's expected place there, as
    paddle's own reader thread does, so a dataset's tensors land on this process's device).
    """

    def __init__(self, batches: Iterator[List[int]], fetch: Callable[[List[int]], Any],
                 convert: Callable[[Any], Any], convert_in_thread: bool = True, depth: int = 2,
                 thread_init: Optional[Callable[[], None]] = None):
        self._batches = batches
        self._fetch = fetch
        self._convert = convert
        self._convert_in_thread = convert_in_thread
        self._thread_init = thread_init
        self._ch = _Channel(depth)
        self._again: collections.deque = collections.deque()  # indices settle() handed back, fetched first
        self._thread: Optional[threading.Thread] = None
        self.checked = False  # the first batch was fetched here and drew from no generator
        self.inline = False   # every batch is fetched in the caller's thread from now on

    def __iter__(self):
        return self

    def __del__(self):
        ch = getattr(self, "_ch", None)
        if ch is not None:
            ch.end()

    # ---- the caller's side -------------------------------------------------------------------------
    def __next__(self):
        item = self._take()
        if item is None:
            if self._again or self.inline or not self.checked:
                return self._next_here()
            self._start()
            item = self._take()
        if item.kind != _BATCH or item.drew_from is not None:  # the thread has ended after this item
            self._join()
            self.inline = self.inline or item.kind == _INLINE or item.drew_from is not None
        if item.kind == _INLINE:
            return self._next_here()
        if item.kind == _END:
            raise StopIteration
        if item.kind == _ERROR:
            raise item.value
        return item.value if self._convert_in_thread else self._convert(item.value)

    def _take(self) -> Optional[_Item]:
        """The next batch the thread fetched (waiting for it while the thread runs), else None."""
        ch = self._ch
        with ch.cond:
            while not ch.ready and self._thread is not None:
                if not self._thread.is_alive():
                    raise RuntimeError("the read-ahead thread ended without handing over a batch")
                ch.cond.wait(timeout=1.0)
            item = ch.ready.popleft() if ch.ready else None
            ch.cond.notify_all()
        return item

    def _next_here(self):
        indices = self._again.popleft() if self._again else next(self._batches)
        check = not (self.checked or self.inline)
        if check:
            before = host_rng_state(), paddle_rng_state()
        with FETCH_LOCK:
            batch = self._convert(self._fetch(indices))
        if check:
            self.checked = True
            self.inline = (host_rng_state(), paddle_rng_state()) != before
        return batch

    def settle(self) -> None:
        """Stop reading ahead until the next batch is asked for, and leave python's and numpy's RNGs
        as a run without read-ahead would have them here (call it before the RNG states are saved)."""
        if self._thread is None:
            return
        self._join()
        ready = self._ch.ready
        if ready and ready[-1].drew_from is not None:  # fetched ahead, and it drew: undo it
            item = ready.pop()
            set_host_rng_state(item.drew_from)
            self._again.append(item.indices)
            self.inline = True

    def close(self) -> None:
        """End the thread (a fetch it is in finishes in the background) and drop what it read."""
        self._ch.end()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5.0)  # a fetch that hangs stays in its daemon thread: never block the caller
        self._ch.ready.clear()
        close = getattr(self._batches, "close", None)
        if close is not None and (thread is None or not thread.is_alive()):
            close()

    def _start(self) -> None:
        self._ch.stop = False
        anchor = full_host_rng_state(), host_rng_state()
        self._thread = threading.Thread(target=_read, name="ptrain-read-ahead", daemon=True, args=(
            self._ch, self._batches, self._fetch, self._convert if self._convert_in_thread else None, anchor,
            self._thread_init))
        self._thread.start()

    def _join(self) -> None:
        self._ch.end()
        if self._thread is not None:
            self._thread.join()
        self._thread = None
        self._ch.stop = False


def _read(ch: _Channel, batches, fetch, convert, anchor: tuple, thread_init) -> None:
    """The thread: fetch batches in order while there is room, until told to stop, the batches end, a
    fetch raises or draws, or the RNGs move between fetches (the caller drew: it fetches from now on)."""
    if thread_init is not None:
        thread_init()
    full, last = anchor
    while True:
        with ch.cond:
            while len(ch.ready) >= ch.depth and not ch.stop:
                ch.cond.wait()
            if ch.stop:
                return
        if host_rng_state() != last:  # the training thread drew from them: hand the batches back to it
            return ch.put(_Item(_INLINE))
        try:
            indices = next(batches)
        except StopIteration:
            return ch.put(_Item(_END))
        except BaseException as exc:  # noqa: BLE001 - the sampler's error, raised at its step
            return ch.put(_Item(_ERROR, exc))
        with FETCH_LOCK:
            try:
                batch = fetch(indices)
                item = _Item(_BATCH, batch if convert is None else convert(batch), indices)
            except BaseException as exc:  # noqa: BLE001 - the dataset's error, raised at its step
                item = _Item(_ERROR, exc, indices)
            now = host_rng_state()
        if now != last:  # it drew; nothing did since the thread started (each check passed): undo with that
            item.drew_from = full
        ch.put(item)
        if item.kind == _ERROR or item.drew_from is not None:
            return
