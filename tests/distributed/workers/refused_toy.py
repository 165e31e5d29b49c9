"""Worker for the exit-code tests: a user's script refused before fit() (issue 40 item 4). Every start appends
its rank to OUT_DIR/../launches first, so a test counts how often the launcher started it.

usage: refused_toy.py OUT_DIR config|data-on-rank-1|exit-3-on-rank-1
  config           TrainingArguments(tensor_parallel_degree=3) on 2 processes: a ConfigError on every rank
  data-on-rank-1   rank 1 alone raises a DataError before fit(); rank 0 goes on into fit() and waits for it
  exit-3-on-rank-1 rank 1 alone calls sys.exit(3) (a documented code, not a trainer error) before fit()
"""

import os
import sys

if __name__ == "__main__":  # first: a rank the launcher stops early has still been counted
    with open(os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), "launches"), "a") as f:
        f.write(os.environ.get("PADDLE_TRAINER_ID", "0") + "\n")

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))
sys.path.append(TESTS)

import paddle
from helpers import ToyDataset, make_mlp

from trainer import Trainer, TrainingArguments
from trainer.errors import DataError


def main(out, mode):
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    degree = 3 if mode == "config" else -1
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=50, report_to=[],
                             evaluation_strategy="no", tensor_parallel_degree=degree)
    if rank == 1 and mode == "data-on-rank-1":
        raise DataError(f"{out}/train.jsonl line 7 is not JSON (a test's bad record)")
    if rank == 1 and mode == "exit-3-on-rank-1":
        sys.exit(3)
    Trainer(make_mlp(), args, train_dataset=ToyDataset(96), loss_fn=paddle.nn.CrossEntropyLoss()).fit()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
