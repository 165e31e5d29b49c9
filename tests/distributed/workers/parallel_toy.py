"""Worker for the parallel-layout parity tests: train a small MLP with repeated blocks under a layout, dump the
logged losses (and the final parameters, gathered) per rank.

usage: parallel_toy.py OUT_DIR JSON_OPTIONS
options: global_batch (samples per optimizer step over all ranks), sharding, recompute, accumulation, clip,
shim (bool: install tests/parallel/cpu_sharding_shim.py first, for stages 2/3 on CPU), steps, hidden.
"""

import json
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))  # the repository first: trainer is the package, not tests/trainer
sys.path.append(TESTS)

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from callbacks import Callback, NaNGuard  # noqa: E402
from trainer import Trainer, TrainingArguments  # noqa: E402
from trainer import distributed as dist  # noqa: E402


class Blocks(paddle.nn.Layer):
    """in -> LayerList of (Linear, Tanh) blocks -> head: the shape recompute and stage 3 act on."""

    def __init__(self, features=16, hidden=64, depth=2, classes=4):
        super().__init__()
        self.inp = paddle.nn.Linear(features, hidden)
        self.blocks = paddle.nn.LayerList([paddle.nn.Sequential(paddle.nn.Linear(hidden, hidden), paddle.nn.Tanh())
                                           for _ in range(depth)])
        self.head = paddle.nn.Linear(hidden, classes)

    def forward(self, x):
        h = paddle.tanh(self.inp(x))
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


class _NanGradient(Callback):
    def __init__(self, step):
        self.step = step

    def on_backward_end(self, trainer):
        if trainer.rank == 1 and trainer.state.global_step + 1 == self.step:
            grad = trainer.model.head.weight.grad
            paddle.assign(paddle.full_like(grad, float("nan")), output=grad)


class Data(paddle.io.Dataset):
    def __init__(self, n=96, features=16, classes=4):
        rng = np.random.RandomState(7 + n)
        self.x = rng.randn(n, features).astype("float32")
        self.y = (np.abs(self.x[:, :classes]).argmax(1)).astype("int64")

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main(out_dir, opts):
    if opts.get("shim"):
        import parallel.cpu_sharding_shim as shim  # test-only: paddle's CPU guards of group_sharded (stages 2/3)

        shim.install()
    world = dist.get_world_size()
    accumulation = opts.get("accumulation", 1)
    per_device = opts["global_batch"] // (world * accumulation)
    paddle.seed(1)
    model = Blocks(hidden=opts.get("hidden", 64))
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=per_device,
                             gradient_accumulation_steps=accumulation, max_steps=opts.get("steps", 6),
                             learning_rate=opts.get("lr", 1e-4), warmup_steps=2, lr_scheduler_type="linear", logging_steps=1,
                             max_grad_norm=opts.get("clip"), report_to=[], save_strategy="no",
                             evaluation_strategy="no", sharding=opts.get("sharding", ""),
                             sharding_parallel_degree=opts.get("sharding_parallel_degree", -1),
                             recompute=opts.get("recompute", False), device="cpu",
                             **({"amp": "bf16", "amp_level": "O2", "amp_master_grad": True} if opts.get("master_grad") else {}))
    callbacks = []
    if opts.get("nan_grad_at_step"):  # a non-finite gradient on rank 1 only, in one step: NaNGuard() must skip it on all
        callbacks = [NaNGuard(), _NanGradient(opts["nan_grad_at_step"])]
    trainer = Trainer(model, args, train_dataset=Data(), loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=callbacks)
    state = trainer.fit()
    metrics = trainer.evaluate(Data(n=40))  # stage 3: through the wrapper, which gathers the slices
    wrapped = trainer.model_wrapped
    if hasattr(wrapped, "get_all_parameters"):  # stage 3: gather the parameter slices back
        wrapped.get_all_parameters()
    rank = dist.get_rank()
    np.savez(os.path.join(out_dir, f"params-rank{rank}.npz"), **{k: v.numpy() for k, v in model.state_dict().items()})
    with open(os.path.join(out_dir, f"result-rank{rank}.json"), "w") as f:
        json.dump({"layout": trainer.layout.describe(), "global_step": state.global_step,
                   "losses": [r["loss"] for r in state.log_history if "loss" in r], "eval_loss": metrics["eval_loss"],
                   "skipped_steps": state.skipped_steps,
                   "optimizer": type(trainer.optimizer).__name__, "model": type(wrapped).__name__}, f)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
