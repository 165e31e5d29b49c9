"""A batch's numpy arrays become the tensors ``paddle.to_tensor`` makes (``trainer.data.loader.to_tensors``):
same dtype, shape, values and place, a copy, ``stop_gradient=True``, whatever the array's layout."""

import numpy as np
import paddle
import pytest

from trainer.data.loader import array_to_tensor, to_tensors

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "int64", "float16", "float32", "float64",
          "complex64", "complex128"]


def same_as_to_tensor(array):
    got, want = array_to_tensor(array), paddle.to_tensor(array)
    assert (got.dtype, tuple(got.shape), str(got.place), got.stop_gradient) == \
           (want.dtype, tuple(want.shape), str(want.place), want.stop_gradient)
    assert got.numpy().dtype == want.numpy().dtype
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    return got


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_numeric_dtype_gives_what_to_tensor_gives(dtype):
    rng = np.random.RandomState(0)
    same_as_to_tensor((rng.randn(3, 5) * 50).astype(dtype))


@pytest.mark.parametrize("array", [
    np.arange(24, dtype="float32").reshape(4, 6)[:, ::2],       # not contiguous
    np.asfortranarray(np.arange(12, dtype="int64").reshape(3, 4)),
    np.float32(2.5) * np.ones((), "float32"),                   # 0-d
    np.zeros((0, 3), "float32"),                                # empty
    np.array([np.nan, np.inf, -np.inf], "float32"),
], ids=["strided", "fortran", "0-d", "empty", "non-finite"])
def test_any_layout_gives_what_to_tensor_gives(array):
    same_as_to_tensor(array)


def test_the_tensor_is_a_copy():
    array = np.ones((2, 2), "float32")
    tensor = array_to_tensor(array)
    array[0, 0] = 7
    del array
    assert tensor.numpy().tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_other_dtypes_fail_as_to_tensor_does():
    strings = np.array(["a", "b"])
    with pytest.raises(Exception) as ours:
        array_to_tensor(strings)
    with pytest.raises(Exception) as theirs:
        paddle.to_tensor(strings)
    assert type(ours.value) is type(theirs.value)


def test_nested_batches_keep_their_structure():
    batch = {"x": np.ones((2, 3), "float32"), "pair": (np.arange(2), "text"), "n": 3}
    out = to_tensors(batch)
    assert set(out) == {"x", "pair", "n"} and out["n"] == 3 and out["pair"][1] == "text"
    assert isinstance(out["x"], paddle.Tensor) and out["x"].shape == [2, 3]
    assert isinstance(out["pair"], list) and out["pair"][0].dtype == paddle.int64
    # a tensor made this way trains like any other
    w = paddle.create_parameter([3, 1], "float32")
    paddle.matmul(out["x"], w).sum().backward()
    assert w.grad is not None and w.grad.shape == [3, 1]
