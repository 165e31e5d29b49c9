"""Worker for the sharded-checkpoint tests: the same run under plain data parallel or sharding stage 1.

usage: shard_toy.py OUT_DIR TAG MODE [STOP_AT] [RESUME] [ASYNC]
MODE: ``plain`` (one process, or paddle.DataParallel under the launcher) or ``stage1`` (fleet's
DygraphShardingOptimizer over every process, built here with fleet directly: fleet.distributed_model and
fleet.distributed_optimizer). Records the loss of every step, the parameters after the load and at the end,
and each save's time on this rank.
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
from trainer import Trainer, TrainingArguments  # noqa: E402
from trainer import distributed as dist  # noqa: E402


def make_model():
    paddle.seed(3)
    return paddle.nn.Sequential(paddle.nn.Linear(8, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 32), paddle.nn.ReLU(),
                                paddle.nn.Linear(32, 2))


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


class Stage1Trainer(Trainer):
    """Sharding stage 1 through fleet: the optimizer wrapped by fleet, the model by fleet instead of DataParallel."""

    def create_optimizer(self):
        from paddle.distributed import fleet

        return fleet.distributed_optimizer(super().create_optimizer())


def main(out_dir, tag, mode, stop_at=0, resume=None, save_async=False):
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    cls = Trainer
    if mode == "stage1":
        from paddle.distributed import fleet

        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1, "sharding_degree": world}
        fleet.init(is_collective=True, strategy=strategy)
        dist.wrap_model = lambda model, find_unused=False: fleet.distributed_model(model)
        cls = Stage1Trainer
    accumulation = max(1, 2 // world)  # the same global batch (16) on 1 and 2 processes
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=8, gradient_accumulation_steps=accumulation,
                             max_steps=16, learning_rate=0.01, warmup_steps=2, lr_scheduler_type="linear",
                             logging_steps=1, report_to=[], save_strategy="steps", save_steps=4,
                             evaluation_strategy="no", save_async=save_async, seed=7,
                             save_total_limit=3 if save_async else None)  # the async run rotates; the others keep all
    record = Record(out_dir, tag)
    trainer = cls(make_model(), args, train_dataset=ToyDataset(128), loss_fn=paddle.nn.CrossEntropyLoss(),
                  callbacks=[record] + ([StopAt(stop_at)] if stop_at else []))
    state = trainer.fit(resume_from_checkpoint=resume)
    rank = dist.get_rank()
    np.savez(os.path.join(out_dir, f"params-{tag}-rank{rank}.npz"),
             **{k: v.numpy() for k, v in trainer.model.state_dict().items()})
    with open(os.path.join(out_dir, f"result-{tag}-rank{rank}.json"), "w") as f:
        json.dump({"global_step": state.global_step, "status": state.status, "saves": record.saves,
                   "accumulation": trainer.args.gradient_accumulation_steps,
                   "loss": {r["step"]: r["loss"] for r in state.log_history if "loss" in r}}, f)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], a[2], int(a[3]) if len(a) > 3 else 0, (a[4] if len(a) > 4 and a[4] != "-" else None),
         len(a) > 5 and a[5] == "async")
