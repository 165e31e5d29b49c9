"""Host memory for a snapshot, kept from one save to the next.

A snapshot copies every tensor of the checkpoint to host memory at the step (both modes: the writer
then works from the copy). ``tensor.numpy()`` allocates a new array each time, and an array above
glibc's mmap threshold (32 MiB at most) comes fresh from the kernel: every page faults and is zeroed on
first touch. For the 20 M-parameter benchmark model (231 MiB a checkpoint) that made the copy cost
~0.5 s of CPU per save where copying into memory already touched costs ~0.03 s (issue 33; the copy is
the whole stall of an asynchronous save). :class:`HostBuffers` keeps one array per tensor name after a
save's write is done and copies the next snapshot into it (through a DLPack view of the CPU tensor, one
copy); a buffer still being written (an asynchronous write in flight) is never handed out: the
snapshot takes a fresh array for it instead.

The price is host memory: the buffers stay allocated between saves (the size of the checkpoint this
rank writes) until :meth:`HostBuffers.clear` (the end of fit()). Tensors not on the host (a GPU's:
``tensor.numpy()`` is the device-to-host copy), bfloat16 (stored as float32) and anything DLPack cannot
view go through :func:`trainer.tensors.to_numpy` as before.
"""

from __future__ import annotations

import threading
from typing import Dict, Tuple

import numpy as np
import paddle

from ..tensors import to_numpy


def _host_view(tensor) -> "np.ndarray | None":
    """A zero-copy numpy view of a CPU tensor, or None where a copy must convert or move it."""
    if not isinstance(tensor, paddle.Tensor) or not tensor.place.is_cpu_place() or tensor.dtype == paddle.bfloat16:
        return None
    try:
        return np.from_dlpack(tensor)
    except (RuntimeError, TypeError, BufferError, ValueError):  # a dtype or layout DLPack does not carry
        return None


class HostBuffers:
    """Reusable host arrays by key; :meth:`copy` lends one, :meth:`release` takes back every one lent."""

    def __init__(self):
        self._free: Dict[str, np.ndarray] = {}
        self._lent: Dict[str, np.ndarray] = {}
        self._lock = threading.Lock()  # copy() runs at the step, release() at the end of a background write

    def copy(self, key: str, tensor) -> np.ndarray:
        """A host copy of ``tensor``, in the buffer kept under ``key`` when there is a free one of its shape and dtype."""
        view = _host_view(tensor)
        if view is None:
            return to_numpy(tensor, keep_float16=True)
        with self._lock:
            buf = self._free.pop(key, None)
            if key in self._lent or buf is None or buf.shape != view.shape or buf.dtype != view.dtype:
                buf = None
        if buf is None:
            buf = np.empty(view.shape, view.dtype)
        np.copyto(buf, view)
        with self._lock:
            self._lent.setdefault(key, buf)  # a second copy under a key in use is simply not kept
        return buf

    def release(self) -> None:
        """Every buffer lent is free again (its write is done: nothing reads it any more)."""
        with self._lock:
            self._free.update(self._lent)
            self._lent.clear()

    def clear(self) -> None:
        """Drop the free buffers (the memory goes back; the next save allocates again)."""
        with self._lock:
            self._free.clear()

    @property
    def nbytes(self) -> Tuple[int, int]:
        """(bytes free, bytes lent)."""
        with self._lock:
            return sum(b.nbytes for b in self._free.values()), sum(b.nbytes for b in self._lent.values())
