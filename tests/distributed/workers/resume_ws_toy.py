"""Worker for the world-size resume test: a num_train_epochs run with warmup_ratio and linear decay.

usage: resume_ws_toy.py OUT_DIR TAG [STOP_AT] [auto]
Records the LR and loss of every step and the sample indices each rank fetched.
"""

import json
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))
sys.path.append(TESTS)

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from helpers import StopAt, ToyDataset, make_mlp  # noqa: E402

from trainer import Trainer, TrainingArguments  # noqa: E402
from trainer import distributed as dist  # noqa: E402


class Recording(ToyDataset):
    def __init__(self, n):
        super().__init__(n)
        self.fetched = []

    def __getitem__(self, i):
        self.fetched.append(int(i))
        return super().__getitem__(i)


def main(out_dir, tag, stop_at=0, resume=None):
    data = Recording(96)
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=8, num_train_epochs=3, learning_rate=0.05,
                             warmup_ratio=0.2, lr_scheduler_type="linear", logging_steps=1, report_to=[],
                             save_strategy="steps", save_steps=12, evaluation_strategy="no", save_async=False)
    trainer = Trainer(make_mlp(seed=1), args, train_dataset=data, loss_fn=paddle.nn.CrossEntropyLoss(),
                      callbacks=[StopAt(stop_at)] if stop_at else [])
    state = trainer.fit(resume_from_checkpoint=resume)
    rank = dist.get_rank()
    np.savez(os.path.join(out_dir, f"params-{tag}-rank{rank}.npz"),
             **{k: v.numpy() for k, v in trainer.model.state_dict().items()})
    with open(os.path.join(out_dir, f"result-{tag}-rank{rank}.json"), "w") as f:
        json.dump({"global_step": state.global_step, "max_steps": state.max_steps, "status": state.status,
                   "accumulation": trainer.args.gradient_accumulation_steps,
                   "lr": {r["step"]: r["learning_rate"] for r in state.log_history if "loss" in r},
                   "warmup_steps": trainer.lr_scheduler.warmup_steps, "fetched": data.fetched}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0,
         sys.argv[4] if len(sys.argv) > 4 else None)
