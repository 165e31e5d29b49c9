"""The checkpoint's tensor files: written outside the GIL (trainer.checkpoint.tensor_file), the same bytes
as ``safetensors.numpy.save_file``, read back by safetensors; around the page cache (``O_DIRECT``) where the
filesystem takes it, through it where not."""

import errno
import hashlib
import os
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


@pytest.fixture(params=["direct", "buffered"])
def mode(request, monkeypatch):
    """Both ways of writing, with pieces small enough to cut through the tensors; ``direct`` checks that
    the file really was opened with ``O_DIRECT`` (this machine's ext4 and tmpfs take it)."""
    opened = []
    real_open = tensor_file.os.open

    def spy(path, flags, *rest):
        opened.append(flags)
        return real_open(path, flags, *rest)

    monkeypatch.setattr(tensor_file.os, "open", spy)
    if request.param == "direct":
        monkeypatch.setattr(tensor_file, "STAGING", tensor_file.ALIGN)  # a flush every 4 KiB, then a padded tail
    else:
        monkeypatch.setattr(tensor_file, "DIRECT", False)
        monkeypatch.setattr(tensor_file, "CHUNK", 64)
    yield request.param
    assert opened and all(bool(flags & os.O_DIRECT) == (request.param == "direct") for flags in opened)


def test_the_same_bytes_as_safetensors_and_read_back_by_it(tmp_path, mode):
    data = tensors()
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    save_tensors(data, str(ours))
    save_file({k: np.require(v, requirements="C") for k, v in data.items()}, str(theirs))
    assert ours.read_bytes() == theirs.read_bytes()
    back = load_file(str(ours))
    assert set(back) == set(data)
    for name, value in data.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)


@pytest.mark.parametrize("length", [4096 - 8 - 80, 4096 * 3, 4096 * 3 + 1])
def test_the_size_and_sha256_returned_are_the_files(tmp_path, mode, length):
    """The manifest's sha256 comes from the write, not from reading the file back: it must be the file's.
    The lengths: a file shorter than one block, whole blocks, one byte over (``O_DIRECT`` pads the last
    block and truncates the padding away)."""
    n = length
    for _ in range(3):  # the header's length depends on the shape's digits: settle n + header == length
        head = len(tensor_file._header({"b": np.zeros(n, "uint8")}))
        n = length - head
    data = {"b": np.arange(n, dtype="uint8")}
    path = tmp_path / "t.safetensors"
    size, digest = save_tensors(data, str(path))
    written = path.read_bytes()
    assert size == len(written) == length
    assert digest == hashlib.sha256(written).hexdigest()
    np.testing.assert_array_equal(load_file(str(path))["b"], data["b"])


def test_a_filesystem_refusing_o_direct_gets_the_file_buffered(tmp_path, monkeypatch):
    """Where ``open`` refuses ``O_DIRECT`` (EINVAL: some network and FUSE filesystems, older tmpfs) or the
    first write does, the file is written through the page cache instead, the same bytes."""
    for refuse in ("open", "write"):
        real_open, real_write = tensor_file.os.open, tensor_file.os.write
        direct_fds, refused = set(), []

        def fussy_open(path, flags, *rest):
            if flags & os.O_DIRECT and refuse == "open":
                raise OSError(errno.EINVAL, "Invalid argument", path)
            fd = real_open(path, flags, *rest)
            (direct_fds.add if flags & os.O_DIRECT else direct_fds.discard)(fd)  # a number reused after close
            return fd

        def fussy_write(fd, data):
            if fd in direct_fds:
                refused.append(fd)
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_write(fd, data)

        monkeypatch.setattr(tensor_file.os, "open", fussy_open)
        monkeypatch.setattr(tensor_file.os, "write", fussy_write)
        path = tmp_path / f"{refuse}.safetensors"
        size, digest = save_tensors(tensors(), str(path))
        monkeypatch.undo()
        save_file({k: np.require(v, requirements="C") for k, v in tensors().items()}, str(tmp_path / "theirs"))
        assert path.read_bytes() == (tmp_path / "theirs").read_bytes(), refuse
        assert size == path.stat().st_size and digest == hashlib.sha256(path.read_bytes()).hexdigest()
        assert (refuse == "write") == bool(refused)


def test_a_dtype_safetensors_has_no_name_for_is_refused(tmp_path):
    with pytest.raises(TypeError, match="'c'.*complex64"):
        save_tensors({"c": np.zeros(3, "complex64")}, str(tmp_path / "x.safetensors"))


def test_another_thread_runs_while_the_file_is_written(tmp_path, monkeypatch, mode):
    """The bytes go out in pieces with the GIL released: a pure-Python thread advances during the write
    (with ``safetensors.numpy.save_file`` it waits for the whole file)."""
    monkeypatch.setattr(tensor_file, "CHUNK", 32 << 20)
    monkeypatch.setattr(tensor_file, "STAGING", 32 << 20)
    data = {"w": np.ones(96 << 20 >> 2, dtype="float32")}  # 96 MiB: 3 pieces
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
    assert len(writes) >= 4  # the header, then the pieces
    assert writes[-1] > writes[1]  # it ran between the pieces
