"""Python's and numpy's global RNGs, read cheaply: a fingerprint to compare (did anything draw?) and to go back to.

:func:`host_rng_state` reads the two Mersenne Twister states straight from
memory (~2 microseconds, where ``random.getstate()`` and
``numpy.random.get_state()`` take ~60 together), after checking once, at
import, that those bytes are the state the APIs report (otherwise it uses the
APIs). :func:`restore_host_rng_state` puts both RNGs back to such a
fingerprint: the read is cheap enough for every sample, the restore runs only
when needed. Used by the read-ahead thread (``trainer.data.read_ahead``: did a
batch draw?) and by datasets that must undo the draws of a sample they give up
on (``models.resnet.imagefolder``: an unreadable image draws nothing).

    >>> before = host_rng_state()
    >>> _ = random.random(), np.random.uniform()
    >>> restore_host_rng_state(before)
    >>> host_rng_state() == before
    True
"""

from __future__ import annotations

import array
import ctypes
import random
import sys
from typing import Callable, Optional

import numpy as np


def _raw_reader(address: Callable[[], int], size: int, expected: Callable[[bytes], bool]) -> Optional[Callable[[], bytes]]:
    """A reader of ``size`` bytes of a generator's C state at ``address()``, if those bytes are
    the state its own API reports (checked once here), else None."""
    def read() -> bytes:  # the address each time: the generator object may be replaced
        return ctypes.string_at(address(), size)

    try:
        return read if expected(read()) else None
    except Exception:  # noqa: BLE001 - another interpreter or numpy: the API then
        return None


def _python_matches(raw: bytes) -> bool:
    version, state, _ = random.getstate()
    return version == 3 and tuple(array.array("I", raw[4:])) + (int.from_bytes(raw[:4], sys.byteorder, signed=True),) == state


def _numpy_matches(raw: bytes) -> bool:
    state = np.random.mtrand._rand._bit_generator.state["state"]
    return (np.array_equal(np.frombuffer(raw[:_MT_WORDS * 4], np.uint32), state["key"])
            and int.from_bytes(raw[_MT_WORDS * 4:], sys.byteorder, signed=True) == state["pos"])


_MT_WORDS = 624
# CPython's RandomObject: PyObject_HEAD (16 bytes), int index, uint32_t state[624]; numpy's
# mt19937_state: uint32_t key[624], int pos. Read in ~2 microseconds where the API takes 18 and 91.
_read_python = _raw_reader(lambda: id(random._inst) + 16, 4 + _MT_WORDS * 4, _python_matches)
_numpy_generator: list = [None, 0]  # numpy's global bit generator and the address of its state (.ctypes is slow)


def _numpy_state_address() -> int:
    generator = np.random.mtrand._rand._bit_generator
    if generator is not _numpy_generator[0]:
        _numpy_generator[:] = [generator, generator.ctypes.state_address]
    return _numpy_generator[1]


_read_numpy = _raw_reader(_numpy_state_address, _MT_WORDS * 4 + 4, _numpy_matches)


def host_rng_state() -> tuple:
    """A fingerprint of python's and numpy's global RNG states: equal fingerprints, no draw between."""
    py = _read_python() if _read_python is not None else random.getstate()
    gauss = getattr(random._inst, "gauss_next", None)
    if _read_numpy is not None:
        return py, gauss, _read_numpy()
    state = np.random.get_state()
    return py, gauss, (state[1].tobytes(), state[2], state[3], state[4])


def full_host_rng_state() -> tuple:
    """python's and numpy's global RNG states, to be restored with :func:`set_host_rng_state`."""
    return random.getstate(), np.random.get_state()


def set_host_rng_state(state: tuple) -> None:
    random.setstate(state[0])
    np.random.set_state(state[1])


def paddle_rng_state() -> list:
    """paddle's CPU generator's state, and this device's CUDA generator's on a GPU."""
    import paddle
    from paddle.base import core

    states = [core.default_cpu_generator().get_state().__getstate__()]
    device = paddle.get_device()
    if device.startswith("gpu"):
        states.append(core.default_cuda_generator(int(device.partition(":")[2] or 0)).get_state().__getstate__())
    return states


def restore_host_rng_state(fingerprint: tuple) -> None:
    """Put python's and numpy's global RNGs back to a :func:`host_rng_state` fingerprint. numpy's cached
    Gaussian (of ``np.random.normal``) stays as it is when the fingerprint is the raw read, which has none."""
    py, gauss, state = fingerprint
    if isinstance(py, bytes):
        index = int.from_bytes(py[:4], sys.byteorder, signed=True)
        py = (3, tuple(array.array("I", py[4:])) + (index,), gauss)
    random.setstate(py)
    if isinstance(state, bytes):
        now = np.random.get_state()
        key = np.frombuffer(state[:_MT_WORDS * 4], dtype=np.uint32)
        np.random.set_state((now[0], key, int.from_bytes(state[_MT_WORDS * 4:], sys.byteorder, signed=True),
                             now[3], now[4]))
    else:
        np.random.set_state(("MT19937", np.frombuffer(state[0], dtype=np.uint32), *state[1:]))
