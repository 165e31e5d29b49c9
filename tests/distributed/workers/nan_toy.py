"""Worker: one nan feature in one sample of rank 1's data; the default NaNGuard must stop both ranks at the
same logging step naming the same step (no hang). usage: nan_toy.py OUT_DIR"""

import json
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))
sys.path.append(TESTS)

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from helpers import ToyDataset, make_mlp  # noqa: E402

from trainer import Trainer, TrainingArguments, TrainingError  # noqa: E402
from trainer import distributed as dist  # noqa: E402
from trainer.data import ResumableDistributedBatchSampler  # noqa: E402


def main(out_dir):
    data = ToyDataset(96)
    sampler = ResumableDistributedBatchSampler(96, 8, num_replicas=2, rank=1, shuffle=True, seed=0)
    sampler.set_epoch(0)
    data.x[list(iter(sampler))[3][0], 3] = np.nan  # rank 1's batch of step 4
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=8, max_steps=10, logging_steps=5,
                             learning_rate=0.01, report_to=[], save_strategy="no", evaluation_strategy="no",
                             max_grad_norm=1.0)  # the default guard names the step through the (all-reduced) clip norm
    trainer = Trainer(make_mlp(), args, train_dataset=data, loss_fn=paddle.nn.CrossEntropyLoss())
    try:
        trainer.fit()
        message = None
    except TrainingError as exc:
        message = str(exc)
    with open(os.path.join(out_dir, f"nan-rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"message": message, "step": trainer.state.global_step}, f)


if __name__ == "__main__":
    main(sys.argv[1])
