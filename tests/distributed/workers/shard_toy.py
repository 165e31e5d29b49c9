"""Worker for the sharded-checkpoint tests: the same run under plain data parallel or a sharding stage.

usage: shard_toy.py OUT_DIR TAG MODE [STOP_AT] [RESUME] [ASYNC]
MODE (``:wide`` appended: a middle layer of 1040 x 1040, above the 2**20 values from which stage 3 splits a
parameter over the ranks): ``plain`` (one process, or paddle.DataParallel under the launcher), ``stage1`` (fleet's
DygraphShardingOptimizer over every process), ``stage2`` or ``stage3`` (paddle's group_sharded_parallel, through
the test-only CPU shim tests/parallel/cpu_sharding_shim.py). Records the loss of every step, the parameters after
the load, and each save's time on this rank.
"""

import json
import os
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))
sys.path.append(TESTS)

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from helpers import StopAt, ToyDataset  # noqa: E402

from callbacks import Callback  # noqa: E402
from trainer import ConfigError, Trainer, TrainingArguments  # noqa: E402
from trainer import distributed as dist  # noqa: E402


def make_model(hidden=32):
    paddle.seed(3)
    return paddle.nn.Sequential(paddle.nn.Linear(8, hidden), paddle.nn.ReLU(), paddle.nn.Linear(hidden, hidden),
                                paddle.nn.ReLU(), paddle.nn.Linear(hidden, 2))


class Record(Callback):
    def __init__(self, out_dir, tag):
        self.out, self.tag, self.saves, self.t0 = out_dir, tag, [], 0.0

    def on_load_end(self, trainer):
        np.savez(os.path.join(self.out, f"loaded-{self.tag}-rank{dist.get_rank()}.npz"),
                 **{k: v.numpy() for k, v in trainer.model.state_dict().items()})

    def on_save_begin(self, trainer):
        self.t0 = time.perf_counter()

    def on_save_end(self, trainer):
        trainer.wait_for_checkpoint()  # this rank's part written (rank 0: and the checkpoint complete)
        self.saves.append(time.perf_counter() - self.t0)


def main(out_dir, tag, mode, stop_at=0, resume=None, save_async=False):
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    mode, _, wide = mode.partition(":")  # "stage3:wide": a 1040-wide middle layer, which stage 3 splits over the ranks
    if mode in ("stage2", "stage3"):
        import parallel.cpu_sharding_shim as shim  # test-only: paddle's CPU guards of group_sharded (stages 2/3)

        shim.install()
    accumulation = max(1, 2 // world)  # the same global batch (16) on 1 and 2 processes
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=8, gradient_accumulation_steps=accumulation,
                             max_steps=16, learning_rate=0.01, warmup_steps=2, lr_scheduler_type="linear",
                             logging_steps=1, report_to=[], save_strategy="steps", save_steps=4,
                             evaluation_strategy="no", save_async=save_async, seed=7,
                             save_total_limit=3 if save_async else None,  # the async run rotates; the others keep all
                             sharding="" if mode == "plain" else mode, device="cpu")
    record = Record(out_dir, tag)
    trainer = Trainer(make_model(1040 if wide else 32), args, train_dataset=ToyDataset(128), loss_fn=paddle.nn.CrossEntropyLoss(),
                  callbacks=[record] + ([StopAt(stop_at)] if stop_at else []))
    if wide:  # NaNGuard reads every parameter at a log, which stage 3 holds only in slices between steps
        from callbacks.nan_guard import NaNGuard

        trainer.remove_callback(NaNGuard)
    state = trainer.fit(resume_from_checkpoint=resume)
    rank = dist.get_rank()
    refused = None
    if tag == "full":  # one inference model from this layout (every rank calls export; rank 0 writes)
        try:
            trainer.export()
        except ConfigError as exc:  # stage 3: refused, export the final checkpoint on one process instead
            refused = str(exc)
    with open(os.path.join(out_dir, f"result-{tag}-rank{rank}.json"), "w") as f:
        json.dump({"global_step": state.global_step, "status": state.status, "saves": record.saves,
                   "accumulation": trainer.args.gradient_accumulation_steps, "export_refused": refused,
                   "loss": {r["step"]: r["loss"] for r in state.log_history if "loss" in r}}, f)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], a[2], int(a[3]) if len(a) > 3 else 0, (a[4] if len(a) > 4 and a[4] != "-" else None),
         len(a) > 5 and a[5] == "async")
