"""A dataset that raises: the user's own error (with its file name) reaches the caller, no hang."""

import gc

import numpy as np
import paddle
import pytest
from helpers import make_mlp

from trainer import DataError, Trainer, TrainingArguments


class Broken(paddle.io.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        if i == 5:
            raise ValueError("cannot decode /data/img_0005.png")
        return np.zeros(8, "float32"), np.int64(0)


def fit(tmp_path, workers):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4, report_to=[],
                             save_strategy="no", dataloader_num_workers=workers, data_seed=0)
    Trainer(make_mlp(), args, train_dataset=Broken(), loss_fn=paddle.nn.CrossEntropyLoss()).fit()


@pytest.mark.timeout(60)
def test_without_workers_the_dataset_error_is_raised_as_is(tmp_path):
    with pytest.raises(ValueError, match="/data/img_0005.png"):
        fit(tmp_path, 0)


@pytest.mark.timeout(60)
def test_with_workers_it_is_a_data_error_that_says_where_to_look(tmp_path):
    with pytest.raises(DataError, match="a DataLoader worker raised while loading a batch"):
        fit(tmp_path, 2)
    gc.collect()  # paddle's failed iterator used to hang here, joining its workers forever


class Batched(paddle.io.Dataset):
    """Loads a batch at a time (``__getitems__``), as a DALI pipeline does; records what it was asked for."""

    def __init__(self, short=False):
        self.calls, self.short = [], short

    def __len__(self):
        return 16

    def __getitem__(self, i):
        raise AssertionError("the loader must ask for whole batches")

    def __getitems__(self, indices):
        self.calls.append(list(indices))
        rows = [(np.full(8, i, "float32"), np.int64(i % 2)) for i in indices]
        return rows[:-1] if self.short else rows


@pytest.mark.timeout(60)
def test_a_dataset_with_getitems_gets_each_batch_of_the_sampler_in_one_call(tmp_path):
    dataset = Batched()
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4, report_to=[],
                             save_strategy="no", evaluation_strategy="no", data_seed=0)
    trainer = Trainer(make_mlp(), args, train_dataset=dataset, loss_fn=paddle.nn.CrossEntropyLoss())
    trainer.fit()
    assert dataset.calls == [trainer._train_sampler.batch_indices(b) for b in range(4)]
    with pytest.raises(DataError, match="returned 3 samples for the 4 indices"):
        args.max_steps = 1
        Trainer(make_mlp(), args, train_dataset=Batched(short=True), loss_fn=paddle.nn.CrossEntropyLoss()).fit()
