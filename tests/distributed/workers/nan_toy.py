"""Worker: one nan feature in one sample of rank 1's data; the default NaNGuard must stop both ranks at the
same logging step naming the same step (no hang). usage: nan_toy.py OUT_DIR [loss-log | loss-save]

``loss-log`` / ``loss-save`` (issue 32): instead, the last rank's loss of step 7 is nan while every gradient
stays finite (a nan added outside the graph), no clipping: the guard must stop every rank at the logging step
10 (``loss-log``) or before saving step 8 (``loss-save``), as one process does."""

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


def main(out_dir, mode=""):
    if mode:
        return nan_loss(out_dir, mode)
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


def nan_loss(out_dir, mode):
    calls = []
    world = dist.get_world_size()

    def loss_fn(logits, labels):
        calls.append(1)
        loss = paddle.nn.functional.cross_entropy(logits, labels)
        if len(calls) == 7 and dist.get_rank() == world - 1:  # no gradient flows into the constant
            loss = loss + paddle.to_tensor(float("nan"))
        return loss

    save = dict(save_strategy="steps", save_steps=8) if mode == "loss-save" else dict(save_strategy="no")
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=8, max_steps=10, logging_steps=5,
                             learning_rate=0.01, report_to=[], evaluation_strategy="no", **save)
    trainer = Trainer(make_mlp(), args, train_dataset=ToyDataset(96), loss_fn=loss_fn)
    code, message = 0, None
    try:
        trainer.fit()
    except TrainingError as exc:
        code, message = exc.exit_code, str(exc)
    with open(os.path.join(out_dir, f"nan-rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"message": message, "step": trainer.state.global_step, "code": code,
                   "params_finite": all(bool(paddle.isfinite(p).all()) for p in trainer.model.parameters())}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
