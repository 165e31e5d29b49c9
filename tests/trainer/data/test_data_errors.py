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
