"""The snapshot's host memory, kept from one save to the next (trainer.checkpoint.host_buffers): reused only
once its write is done, and every checkpoint holds its own step's values."""

import os

import numpy as np
import paddle
from helpers import ToyDataset, make_mlp, params_of

from callbacks import Callback
from trainer import Trainer, TrainingArguments
from trainer.checkpoint.host_buffers import HostBuffers
from trainer.checkpoint.manifest import read_checkpoint, verify


def test_a_buffer_is_reused_after_release_and_never_while_lent():
    pool = HostBuffers()
    t = paddle.to_tensor(np.arange(12, dtype="float32").reshape(3, 4))
    first = pool.copy("w", t)
    np.testing.assert_array_equal(first, t.numpy())
    t.set_value(paddle.full([3, 4], 7.0))
    while_lent = pool.copy("w", t)  # the first copy is still being written: it must not change
    assert not np.shares_memory(first, while_lent) and first[0, 1] == 1 and (while_lent == 7).all()
    pool.release()
    again = pool.copy("w", t + 1)
    assert np.shares_memory(again, first) and (again == 8).all()
    assert pool.nbytes == (0, 48)
    pool.release()
    pool.clear()
    assert pool.nbytes == (0, 0)


def test_a_new_shape_gets_a_new_buffer_and_bfloat16_is_stored_as_float32():
    pool = HostBuffers()
    pool.copy("w", paddle.ones([2, 2]))
    pool.release()
    wider = pool.copy("w", paddle.ones([2, 3]))
    assert wider.shape == (2, 3)
    half = pool.copy("b", paddle.ones([2], dtype="bfloat16"))
    assert half.dtype == np.float32 and (half == 1).all()
    assert pool.copy("h", paddle.ones([2], dtype="float16")).dtype == np.float16
    strided = paddle.to_tensor(np.arange(16, dtype="float32").reshape(4, 4)).transpose([1, 0])
    np.testing.assert_array_equal(pool.copy("s", strided), strided.numpy())


class Record(Callback):
    """The parameters as they are when each save starts (what its checkpoint must hold)."""

    def __init__(self):
        self.at = {}

    def on_save_begin(self, trainer):
        self.at[trainer.state.global_step] = params_of(trainer.model)


def test_async_saves_in_reused_memory_hold_each_their_own_step(tmp_path):
    record = Record()
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=10, learning_rate=0.05,
                             save_strategy="steps", save_steps=2, report_to=[], evaluation_strategy="no",
                             save_async=True, save_total_limit=None)
    trainer = Trainer(make_mlp(), args, train_dataset=ToyDataset(64), loss_fn=paddle.nn.CrossEntropyLoss(),
                      callbacks=[record])
    trainer.fit()
    assert sorted(record.at) == [2, 4, 6, 8, 10]
    for step, params in record.at.items():
        path = os.path.join(str(tmp_path), "checkpoints", f"step-{step}")
        verify(path)
        _, model, _ = read_checkpoint(path)
        for name, value in params.items():
            np.testing.assert_array_equal(model[name], value, err_msg=f"step {step}: {name}")
    assert record.at[2]["0.weight"].tolist() != record.at[10]["0.weight"].tolist()  # training moved them
    assert trainer._writer.buffers.nbytes == (0, 0)  # given back at the end of fit()
