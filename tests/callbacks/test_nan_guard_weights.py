"""The default NaNGuard checks the parameters at logging steps: a nan or inf in a weight the loss never
shows stops training at the next logging step; finite weights whose float32 sum overflows do not (the fast
sum-based check is confirmed by an exact one before it stops anything)."""

import numpy as np
import paddle
import pytest
from helpers import ToyDataset

from callbacks import Callback
from trainer import Trainer, TrainingArguments, TrainingError


class WithSpare(paddle.nn.Layer):
    """A small MLP and a parameter the forward never uses (no gradient, the optimizer leaves it alone)."""

    def __init__(self):
        super().__init__()
        paddle.seed(0)
        self.body = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 2))
        self.spare = self.create_parameter([4], default_initializer=paddle.nn.initializer.Constant(0.0))

    def forward(self, x):
        return self.body(x)


class SetSpare(Callback):
    def __init__(self, values, at_step):
        self.values, self.at_step = values, at_step

    def on_step_end(self, trainer):
        if trainer.state.global_step == self.at_step:
            trainer.model.spare.set_value(paddle.to_tensor(np.array(self.values, dtype="float32")))


def fit(tmp_path, values):
    model = WithSpare()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=6, logging_steps=2, report_to=[], save_strategy="no")
    trainer = Trainer(model, args, train_dataset=ToyDataset(64), loss_fn=paddle.nn.CrossEntropyLoss(),
                      callbacks=[SetSpare(values, at_step=3)])
    return trainer, trainer.fit


def test_finite_weights_whose_sum_overflows_do_not_stop_training(tmp_path):
    trainer, run = fit(tmp_path, [3e38, 3e38, -1.0, 1.0])  # finite; their float32 sum is inf
    state = run()
    assert state.global_step == 6 and state.status == "completed"
    with np.errstate(over="ignore"):
        assert np.isinf(trainer.model.spare.numpy().sum(dtype="float32"))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_weight_stops_at_the_next_logging_step(tmp_path, bad):
    _, run = fit(tmp_path, [0.0, bad, 0.0, 0.0])
    with pytest.raises(TrainingError, match=r"the parameters hold nan or inf at step 4 \(checked at logging step 4; "
                                            r"they were finite at step 2"):
        run()
