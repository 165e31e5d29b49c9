"""Writing a ``.safetensors`` file without holding the GIL for its bytes.

``safetensors.numpy.save_file`` (0.8) writes the tensors from Rust with the GIL held: a 200 MiB file
kept every other Python thread of the process waiting ~3.8 s of its 4.4 s here, so an asynchronous
save stopped the training thread for nearly as long as a synchronous one, and on a loaded machine for
longer (issue 33). :func:`save_tensors` writes the same format (an 8-byte little-endian header length,
the JSON header padded with spaces to a multiple of 8, the tensors' bytes back to back in header order)
with ``os.write`` of each array's buffer in pieces of :data:`CHUNK` bytes: Python releases the GIL for
every ``write`` system call, so the training thread runs between and during them. Each piece is hashed
(``hashlib``'s ``update`` also releases the GIL) right before it is written, so the file's sha256 for the
manifest comes with the write: the file is not read back to hash it (the pages it was written from are
the pages hashed). Pieces are large (:data:`CHUNK`): every time the writer thread takes the GIL back
between two calls, the training thread may have to hand it over (and wait for it again), so fewer
calls mean fewer hand-overs (issue 33). Where the filesystem takes ``O_DIRECT`` (:data:`DIRECT`), the bytes
are first copied (``numpy.copyto``, outside the GIL) into a page-aligned staging buffer, hashed there and
written from it around the page cache; the last block is padded to :data:`ALIGN` and the padding truncated
away. The files are read
by ``safetensors`` as before (``trainer.checkpoint.load``); ``tests/trainer/checkpoint/test_tensor_file.py``
checks the two writers give byte-identical files.
"""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import struct
import threading
from typing import Dict, Tuple

import numpy as np

#: bytes per hash-and-write through the page cache: the GIL is taken back between calls, never held for one.
#: The writer's CPU per 231 MiB file fell with the piece size (``python -m benchmarks.save_stall --writers
#: buffered:1,buffered:8,buffered:128``: 1 MiB ~700 ms, 8 MiB ~500, 128 MiB ~330, on a loaded 2-core
#: machine), as did the training thread's extra CPU beside it
CHUNK = 128 << 20

#: write tensor files with ``O_DIRECT`` where the filesystem takes it. Through the page cache, the kernel's
#: copy of a 231 MiB file cost the writer thread 0.06-0.6 s of CPU here (much more when dirty pages
#: have to be written back first), taken from the training process; with ``O_DIRECT`` the disk reads
#: the staging buffer itself: what is left is the sha256 and the copy into the staging buffer, 0.18 s
#: against 0.27 s buffered in 128 MiB pieces on a loaded machine (``python -m benchmarks.save_stall``)
DIRECT = True
_O_DIRECT = getattr(os, "O_DIRECT", 0)  # Linux; elsewhere the files are written buffered
#: ``O_DIRECT``'s alignment of buffers, offsets and lengths: a page, a multiple of every disk's block size
ALIGN = 4096
#: the staging buffer of an ``O_DIRECT`` write: bytes copied, hashed and written at a time
STAGING = 32 << 20
#: how a filesystem says it does not take ``O_DIRECT`` (at open or at the first write): the file is written buffered
_REFUSED = {errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP}

#: numpy dtype name -> safetensors dtype (the dtypes checkpoints hold)
_DTYPES = {"bool": "BOOL", "int8": "I8", "uint8": "U8", "int16": "I16", "uint16": "U16", "float16": "F16",
           "int32": "I32", "uint32": "U32", "float32": "F32", "int64": "I64", "uint64": "U64", "float64": "F64"}
#: safetensors' order of tensors in a file: by its dtype ranking, highest first, then by name
_RANK = {name: rank for rank, name in enumerate(("BOOL", "U8", "I8", "I16", "U16", "F16", "I32", "U32", "F32",
                                                 "F64", "I64", "U64"))}


def _header(arrays: Dict[str, np.ndarray]) -> bytes:
    entries, offset = {}, 0
    for name, array in arrays.items():
        dtype = _DTYPES.get(array.dtype.name)
        if dtype is None:
            raise TypeError(f"tensor {name!r}: dtype {array.dtype} has no safetensors name")
        entries[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _ordered(tensors: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Contiguous little-endian arrays in safetensors' order (:data:`_RANK`)."""
    ready = {}
    for name, array in tensors.items():
        array = np.require(array, requirements="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
        if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and not np.little_endian):
            array = array.astype(array.dtype.newbyteorder("<"))
        ready[name] = array
    return dict(sorted(ready.items(), key=lambda kv: (-_RANK.get(_DTYPES.get(kv[1].dtype.name), -1), kv[0])))


def save_tensors(tensors: Dict[str, np.ndarray], path: str) -> Tuple[int, str]:
    """``tensors`` to ``path`` in the safetensors format, hashed and written in pieces outside the GIL;
    returns the file's (bytes, sha256 hex digest). Written around the page cache (``O_DIRECT``) where the
    filesystem allows it (:data:`DIRECT`), else through it."""
    arrays = _ordered(tensors)
    parts = [memoryview(_header(arrays))] + [memoryview(a.reshape(-1)).cast("B") for a in arrays.values() if a.nbytes]
    if DIRECT and _O_DIRECT:
        written = _write_direct(parts, path)
        if written is not None:
            return written
    return _write_buffered(parts, path)


def _write_buffered(parts, path: str) -> Tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for part in parts:
            size += _write_all(fd, part, digest)
    finally:
        os.close(fd)
    return size, digest.hexdigest()


def _write_all(fd: int, data: memoryview, digest) -> int:
    for start in range(0, len(data), CHUNK):
        piece = data[start:start + CHUNK]
        digest.update(piece)
        _write_out(fd, piece)
    return len(data)


def _write_out(fd: int, data: memoryview) -> None:
    """All of ``data`` to ``fd`` (``os.write`` may take less than it is given)."""
    done = 0
    while done < len(data):
        done += os.write(fd, data[done:])


class _Staging:
    """One page-aligned buffer of :data:`STAGING` bytes (an anonymous ``mmap``), kept for the next file:
    new pages fault and are zeroed on first touch, which is what reusing it avoids."""

    _lock = threading.Lock()
    _kept: "mmap.mmap | None" = None

    def __enter__(self) -> mmap.mmap:
        self._own = _Staging._lock.acquire(blocking=False)  # a second writer at once gets a buffer of its own
        buf = _Staging._kept if self._own else None
        if buf is None or len(buf) != STAGING:
            buf = mmap.mmap(-1, STAGING)
            if self._own:
                _Staging._kept = buf
        self._buf = buf
        return buf

    def __exit__(self, *exc) -> None:
        if self._own:
            _Staging._lock.release()
        elif self._buf is not _Staging._kept:
            self._buf.close()


def _write_direct(parts, path: str) -> "Tuple[int, str] | None":
    """The file written with ``O_DIRECT`` from a page-aligned staging buffer; None (nothing kept) where the
    filesystem refuses ``O_DIRECT`` (:data:`_REFUSED`: some network and FUSE filesystems, older tmpfs): the caller
    writes it buffered.

    The bytes are copied into the staging buffer (``numpy.copyto``: outside the GIL), hashed there, and
    written in :data:`STAGING`-byte blocks; the last block is padded to :data:`ALIGN` and the file then
    truncated to its length."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_DIRECT, 0o644)
    except OSError as exc:
        if exc.errno in _REFUSED:
            return None
        raise
    digest, size, refused = hashlib.sha256(), 0, False
    try:
        with _Staging() as buf:
            stage, view, fill, source = np.frombuffer(buf, dtype=np.uint8), memoryview(buf), 0, None
            try:
                for part in parts:
                    source, at = np.frombuffer(part, dtype=np.uint8), 0
                    while at < len(source):
                        n = min(len(stage) - fill, len(source) - at)
                        np.copyto(stage[fill:fill + n], source[at:at + n])
                        fill, at = fill + n, at + n
                        if fill == len(stage):
                            size += _flush(fd, view, fill, digest)
                            fill = 0
                if fill:
                    size += _flush(fd, view, fill, digest)
            finally:
                del stage, source, view  # the mmap is kept or closed: no numpy view may outlive this block
        os.ftruncate(fd, size)
    except OSError as exc:
        refused = exc.errno in _REFUSED and size == 0  # O_DIRECT accepted at open, refused at the first write
        if not refused:
            raise
    finally:
        os.close(fd)
    return None if refused else (size, digest.hexdigest())


def _flush(fd: int, view: memoryview, fill: int, digest) -> int:
    """Hash ``view[:fill]`` and write it, padded with zeros to :data:`ALIGN` (the padding is truncated away)."""
    digest.update(view[:fill])
    padded = -(-fill // ALIGN) * ALIGN
    view[fill:padded] = bytes(padded - fill)
    _write_out(fd, view[:padded])
    return fill
