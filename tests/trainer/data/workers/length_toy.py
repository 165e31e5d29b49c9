"""A training set whose length changes after the first epoch (issue 40 item 11): run in-process by
tests/trainer/data/test_length_change.py, and under paddle.distributed.launch as
``length_toy.py OUT NEW_LENGTH``: each rank writes the sample indices it read and the steps it ran."""

import json
import os
import sys

import numpy as np
import paddle

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
from callbacks import Callback
from trainer import Trainer, TrainingArguments
from trainer import distributed as dist


class Changing(paddle.io.Dataset):
    """``n`` samples (a file listing that someone extends or prunes in place); records every index asked for."""

    def __init__(self, n: int):
        self.n, self.asked = n, []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.asked.append(int(i))
        if i >= self.n:
            raise IndexError(f"sample {i} of {self.n}")
        return np.full(8, i / 56, "float32"), np.int64(i % 2)


class ChangeAfterFirstEpoch(Callback):
    def __init__(self, dataset: Changing, n: int):
        self.dataset, self.n = dataset, n

    def on_epoch_end(self, trainer):
        self.dataset.n = self.n


def train(out: str, new_n: int, n: int = 40):
    """3 epochs of ``n`` samples (batch 8 per process); the dataset has ``new_n`` from epoch 1 on."""
    data = Changing(n)
    paddle.seed(0)
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=8, num_train_epochs=3, report_to=[],
                             save_strategy="no", learning_rate=0.01, data_seed=0)
    trainer = Trainer(paddle.nn.Linear(8, 2), args, train_dataset=data, loss_fn=paddle.nn.CrossEntropyLoss(),
                      callbacks=[ChangeAfterFirstEpoch(data, new_n)])
    try:
        trainer.fit()
    finally:
        with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
            json.dump({"asked": data.asked, "steps": trainer.state.global_step, "status": trainer.state.status}, f)
    return data, trainer


if __name__ == "__main__":
    train(sys.argv[1], int(sys.argv[2]))
