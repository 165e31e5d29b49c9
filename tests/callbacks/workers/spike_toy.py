"""Worker for the 2-process LossSpikeRecovery test: rank 1's batches of steps
13 and 14 are nan; the loss reduced across ranks is nan on both, so both roll
back to step 12 together and skip steps 13-16.

usage: spike_toy.py OUT_DIR
"""

import json
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))  # the repository first: trainer is the package, not tests/trainer
sys.path.append(TESTS)

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from helpers import ToyDataset  # noqa: E402

from callbacks import LossSpikeRecovery  # noqa: E402
from trainer import Trainer, TrainingArguments  # noqa: E402
from trainer import distributed as dist  # noqa: E402
from trainer.data import ResumableDistributedBatchSampler  # noqa: E402

N, BATCH = 256, 4


class Poisoned(ToyDataset):
    def __init__(self, bad):
        super().__init__(N)
        self.bad = set(bad)

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return (np.full_like(x, np.nan) if i in self.bad else x), y


def main(out_dir):
    rank = dist.get_rank()
    sampler = ResumableDistributedBatchSampler(N, BATCH, num_replicas=2, rank=1, shuffle=True, seed=0)
    sampler.set_epoch(0)
    rank1_batches = list(iter(sampler))
    bad = [i for step in (13, 14) for i in rank1_batches[step - 1]] if rank == 1 else []
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=BATCH, max_steps=24, logging_steps=2,
                             save_steps=4, learning_rate=0.01, lr_scheduler_type="constant", report_to=["jsonl"])
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.Tanh(), paddle.nn.Linear(16, 2))
    recovery = LossSpikeRecovery(lr_factor=0.5)
    trainer = Trainer(model, args, train_dataset=Poisoned(bad), loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[recovery])
    state = trainer.fit()
    params = {k: v.numpy().tolist() for k, v in model.state_dict().items()}
    with open(os.path.join(out_dir, f"spike-rank{rank}.json"), "w") as f:
        json.dump({"status": state.status, "global_step": state.global_step, "skipped_steps": state.skipped_steps,
                   "rollbacks": recovery.rollbacks, "lr": trainer.current_lr(), "params": params,
                   "last_loss": state.log_history[-1].get("loss")}, f)


if __name__ == "__main__":
    main(sys.argv[1])
