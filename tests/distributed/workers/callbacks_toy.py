"""Worker for the 2-process callback test: LRWarmup (with the linear scaling rule), EarlyStopping and Export.

usage: callbacks_toy.py OUT_DIR
"""

import json
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))  # the repository first: trainer is the package, not tests/trainer
sys.path.append(TESTS)

import paddle  # noqa: E402
from helpers import ToyDataset, make_mlp  # noqa: E402

from callbacks import Callback, EarlyStopping, Export  # noqa: E402
from trainer import Trainer, TrainingArguments  # noqa: E402
from trainer import distributed as dist  # noqa: E402


class RecordLR(Callback):
    def __init__(self):
        self.lrs = []

    def on_step_begin(self, trainer):
        self.lrs.append(trainer.optimizer.get_lr())


def main(out_dir):
    # eval_loss barely moves at this learning rate: no change beats min_delta, so EarlyStopping stops
    # after the first evaluation plus `patience` more, on every rank at the same step (metrics are reduced)
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                             max_steps=40, learning_rate=1e-9, warmup_steps=3, lr_scheduler_type="constant",
                             scale_lr_by_batch=4, optim="sgd", report_to=[], save_strategy="no",
                             evaluation_strategy="steps", eval_steps=2)
    stopper, exporter, rec = EarlyStopping(patience=2, min_delta=1e-3), Export(), RecordLR()
    trainer = Trainer(make_mlp(seed=1), args, train_dataset=ToyDataset(64), eval_dataset=ToyDataset(21, seed=3),
                      loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[stopper, exporter, rec])
    state = trainer.fit()
    rank = dist.get_rank()
    with open(os.path.join(out_dir, f"callbacks-rank{rank}.json"), "w") as f:
        json.dump({"global_step": state.global_step, "status": state.status, "stopper": stopper.state_dict(),
                   "lrs": rec.lrs, "global_batch": state.global_batch_size,
                   "export": None if exporter.result is None else {"path": exporter.result.path,
                                                                   "max_abs_diff": exporter.result.max_abs_diff}}, f)


if __name__ == "__main__":
    main(sys.argv[1])
