"""Worker for the failure-naming test: rank 1 alone meets a bad sample (a DataError) after a few steps.

usage: data_error_toy.py OUT_DIR
"""

import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))
sys.path.append(TESTS)

import paddle  # noqa: E402
from helpers import ToyDataset, make_mlp  # noqa: E402

from trainer import Trainer, TrainingArguments  # noqa: E402
from trainer import distributed as dist  # noqa: E402
from trainer.errors import DataError  # noqa: E402


class BadOnRank1(ToyDataset):
    def __getitem__(self, i):
        if dist.get_rank() == 1 and self.calls > 40:
            raise DataError(f"sample {i} of rank 1 is malformed (a test's bad record)")
        self.calls += 1
        return super().__getitem__(i)


def main(out):
    data = BadOnRank1(96)
    data.calls = 0
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=200, report_to=[],
                             save_steps=5, evaluation_strategy="no")
    Trainer(make_mlp(), args, train_dataset=data, loss_fn=paddle.nn.CrossEntropyLoss()).fit()


if __name__ == "__main__":
    main(sys.argv[1])
