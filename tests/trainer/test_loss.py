"""``LossWindow``: the logging window's loss sum is bitwise the sum of adding each step's loss in turn,
across its folds, after a reset, and from a window restored out of a checkpoint."""

import numpy as np
import paddle
import pytest

from trainer.loss import LossWindow


def sequential(start, losses):
    total = paddle.to_tensor(start, dtype="float32") if start is not None else None
    for loss in losses:
        total = loss if total is None else total + loss
    return total


@pytest.mark.parametrize("steps", [1, 2, 63, 64, 65, 200])
@pytest.mark.parametrize("restored", [None, 12.345678])
def test_the_sum_is_bitwise_the_sequential_one(steps, restored):
    rng = np.random.RandomState(steps)
    losses = [paddle.to_tensor(v) for v in (rng.lognormal(0, 3, steps) * rng.choice([1, -1], steps)).astype("float32")]
    window = LossWindow(restored, 5 if restored is not None else 0)
    for loss in losses:
        window.add(loss)
    assert window.steps == steps + (5 if restored is not None else 0)
    assert window.total().numpy().tobytes() == sequential(restored, losses).numpy().tobytes()


def test_an_empty_window_sums_to_zero_and_a_reset_starts_over():
    window = LossWindow()
    assert float(window.total()) == 0.0 and window.steps == 0
    window.add(paddle.to_tensor(3.0))
    window.reset()
    assert float(window.total()) == 0.0 and window.steps == 0
    window.add(paddle.to_tensor(np.float32(1.5)))
    window.add(paddle.to_tensor(np.float16(2.0)))  # other dtypes are summed as float32
    assert window.total().dtype == paddle.float32 and float(window.total()) == 3.5


def test_docstring_examples():
    import doctest

    import trainer.loss

    result = doctest.testmod(trainer.loss)
    assert result.failed == 0 and result.attempted > 0
