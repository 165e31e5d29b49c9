"""A plain Trainer script for the elastic tests: nothing in it knows about restarts.

usage: elastic_toy.py OUT_DIR MAX_STEPS STEP_SECONDS [GRADIENT_ACCUMULATION_STEPS]

Rank 0 appends {"t", "pid", "step", "world_size"} to OUT_DIR/progress.jsonl at every step end (the tests read
when training went on after a kill and at which world size) and writes OUT_DIR/result.json at the end.
"""

import json
import os
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))  # the repository first: trainer is the package, not tests/trainer
sys.path.append(TESTS)

import paddle  # noqa: E402
from helpers import ToyDataset, make_mlp  # noqa: E402

from callbacks import Callback  # noqa: E402
from trainer import Trainer, TrainingArguments  # noqa: E402


class Pace(Callback):
    """Makes each step last ``seconds`` (so a test can kill mid-run) and records progress on rank 0."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_end(self, trainer):
        time.sleep(self.seconds)
        if trainer.is_main_process:
            with open(os.path.join(trainer.args.output_dir, "progress.jsonl"), "a") as f:
                f.write(json.dumps({"t": time.time(), "pid": os.getpid(), "step": trainer.state.global_step,
                                    "world_size": trainer.world_size}) + "\n")


def main(out_dir, max_steps, seconds, accumulation=1):
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=4, max_steps=max_steps,
                             gradient_accumulation_steps=accumulation, learning_rate=0.05, warmup_steps=3,
                             lr_scheduler_type="linear", logging_steps=5,
                             report_to=[], disable_tqdm=True, save_strategy="steps", save_steps=2,
                             evaluation_strategy="no")
    trainer = Trainer(make_mlp(seed=1), args, train_dataset=ToyDataset(96), loss_fn=paddle.nn.CrossEntropyLoss(),
                      callbacks=[Pace(seconds)])
    state = trainer.fit()
    if trainer.is_main_process:
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump({"global_step": state.global_step, "status": state.status, "world_size": trainer.world_size,
                       "lr": trainer.optimizer.get_lr(),
                       "gradient_accumulation_steps": trainer.args.gradient_accumulation_steps}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), *map(int, sys.argv[4:5]))
