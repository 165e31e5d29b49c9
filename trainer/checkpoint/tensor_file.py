"""Writing a ``.safetensors`` file without holding the GIL for its bytes.

``safetensors.numpy.save_file`` (0.8) writes the tensors from Rust with the GIL held: a 200 MiB file
kept every other Python thread of the process waiting ~3.8 s of its 4.4 s here, so an asynchronous
save stopped the training thread for nearly as long as a synchronous one, and on a loaded machine for
longer (issue 33). :func:`save_tensors` writes the same format (an 8-byte little-endian header length,
the JSON header padded with spaces to a multiple of 8, the tensors' bytes back to back in header order)
with ``os.write`` of each array's buffer in pieces of :data:`CHUNK` bytes: Python releases the GIL for
every ``write`` system call, so the training thread runs between and during them. The files are read
by ``safetensors`` as before (``trainer.checkpoint.load``); ``tests/trainer/checkpoint/test_tensor_file.py``
checks the two writers give byte-identical files.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Dict

import numpy as np

CHUNK = 8 << 20  #: bytes per write call: the GIL is taken back between calls, never held for one

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


def save_tensors(tensors: Dict[str, np.ndarray], path: str) -> None:
    """``tensors`` to ``path`` in the safetensors format, written in :data:`CHUNK` pieces outside the GIL."""
    arrays = _ordered(tensors)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, memoryview(_header(arrays)))
        for array in arrays.values():
            if array.nbytes:
                _write_all(fd, memoryview(array.reshape(-1)).cast("B"))
    finally:
        os.close(fd)


def _write_all(fd: int, data: memoryview) -> None:
    done = 0
    while done < len(data):
        done += os.write(fd, data[done:done + CHUNK])
