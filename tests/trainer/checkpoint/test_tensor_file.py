"""The checkpoint's tensor files: written outside the GIL (trainer.checkpoint.tensor_file), the same bytes
as ``safetensors.numpy.save_file``, read back by safetensors."""

import threading

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from trainer.checkpoint import tensor_file
from trainer.checkpoint.tensor_file import save_tensors


def tensors():
    rng = np.random.RandomState(0)
    return {"fc.weight": rng.randn(33, 17).astype("float32"), "fc.bias": rng.randn(17).astype("float32"),
            "moment": rng.randn(5, 3).astype("float64"), "half": rng.randn(4, 4).astype("float16"),
            "step": np.array(7, dtype="int64"), "ids": np.arange(9, dtype="int32"), "mask": np.array([True, False]),
            "bytes": np.arange(5, dtype="uint8"), "bits": np.arange(6, dtype="uint16"), "none": np.zeros((0, 4), "float32"),
            "strided": rng.randn(8, 8).astype("float32")[:, ::2], "big_endian": np.arange(4, dtype=">i4")}


def test_the_same_bytes_as_safetensors_and_read_back_by_it(tmp_path, monkeypatch):
    monkeypatch.setattr(tensor_file, "CHUNK", 64)  # many pieces per tensor
    data = tensors()
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    save_tensors(data, str(ours))
    save_file({k: np.require(v, requirements="C") for k, v in data.items()}, str(theirs))
    assert ours.read_bytes() == theirs.read_bytes()
    back = load_file(str(ours))
    assert set(back) == set(data)
    for name, value in data.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_a_dtype_safetensors_has_no_name_for_is_refused(tmp_path):
    with pytest.raises(TypeError, match="'c'.*complex64"):
        save_tensors({"c": np.zeros(3, "complex64")}, str(tmp_path / "x.safetensors"))


def test_another_thread_runs_while_the_file_is_written(tmp_path):
    """The bytes go out in pieces with the GIL released: a pure-Python thread advances during the write
    (with ``safetensors.numpy.save_file`` it waits for the whole file)."""
    data = {"w": np.ones(96 << 20 >> 2, dtype="float32")}  # 96 MiB: 12 pieces of CHUNK
    count, started, stop = [0], threading.Event(), threading.Event()

    def spin():
        started.set()
        while not stop.is_set():
            count[0] += 1

    thread = threading.Thread(target=spin)
    thread.start()
    started.wait(60)
    writes = []
    real_write = tensor_file.os.write

    def counted_write(fd, view):
        writes.append(count[0])  # where the other thread was when each piece went out
        return real_write(fd, view)

    try:
        tensor_file.os.write = counted_write
        save_tensors(data, str(tmp_path / "w.safetensors"))
    finally:
        tensor_file.os.write = real_write
        stop.set()
        thread.join(60)
    assert len(writes) >= 12
    assert writes[-1] > writes[1]  # it ran between the pieces
