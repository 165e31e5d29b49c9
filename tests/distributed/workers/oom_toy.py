"""Trains (SGD; OOM_TOY_OPTIM=adamw and OOM_TOY_LR for AdamW, which magnifies float rounding on near-zero gradients)
a ReLU MLP whose activations dominate its memory, under an address-space limit (RLIMIT_AS) that makes paddle's
allocator fail for real when the per-device batch is too large.

    python oom_toy.py OUT LIMIT_MIB LIMITED_RANK BATCH ACCUM STEPS AUTO [save | CHECKPOINT]

LIMIT_MIB: address space allowed above what the process holds when the first step begins (0: no limit); LIMITED_RANK: the rank that gets the limit (-1: every rank). Writes params-rankR.npz and
result-rankR.json (micro-batch before and after, global batch, status, log lines). ``save`` saves the last step; a
checkpoint path resumes from it. OOM_TOY_WIDTH=2097152 makes one sample need 8 MiB."""

import json
import logging
import os
import resource
import sys

import numpy as np
import paddle
import psutil

from callbacks import Callback
from trainer import Trainer, TrainingArguments
from trainer.errors import TrainerError

out, limit_mib, limited_rank, batch, accum, steps, auto = sys.argv[1:8]
extra = sys.argv[8] if len(sys.argv) > 8 else ""
resume = extra if extra not in ("", "save") else None
limit_mib, limited_rank, batch, accum, steps = int(limit_mib), int(limited_rank), int(batch), int(accum), int(steps)
rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))

FEATURES, WIDTH = 32, int(os.environ.get("OOM_TOY_WIDTH", "4096"))  # 2**21: one sample needs 8 MiB
OPTIM = os.environ.get("OOM_TOY_OPTIM", "sgd")  # adamw: OOM_TOY_LR sets its learning rate too
rng = np.random.RandomState(0)
x = rng.randn(batch * accum * world * 2, FEATURES).astype("float32")
y = (x[:, 0] > 0).astype("int64")


class Data(paddle.io.Dataset):
    def __len__(self):
        return len(y)

    def __getitem__(self, i):
        return x[i], y[i]


paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(FEATURES, WIDTH), paddle.nn.ReLU(), paddle.nn.Linear(WIDTH, 2))
args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=batch,
                         gradient_accumulation_steps=accum, auto_find_batch_size=auto == "1",
                         learning_rate=float(os.environ.get("OOM_TOY_LR", "0.05")), optim=OPTIM,
                         report_to=[], save_strategy="steps", save_steps=steps if extra else 10**6,
                         evaluation_strategy="no", logging_steps=1, overwrite_output_dir=resume is None,
                         resume_from_checkpoint=resume, seed=0, lr_scheduler_type="linear",
                         skip_memory_metrics=os.environ.get("OOM_TOY_MEMORY_METRICS") != "1")
# paddle loads its math libraries at the first ops: load them before any limit, on a throwaway layer
_warm = paddle.nn.Linear(FEATURES, 2)
paddle.nn.functional.cross_entropy(paddle.nn.functional.relu(_warm(paddle.to_tensor(x[:4]))), paddle.to_tensor(y[:4])).backward()
paddle.optimizer.SGD(parameters=_warm.parameters()).step()
del _warm


class Limit(Callback):
    """Sets the limit when the first step begins: fit()'s threads and the math libraries exist by then."""

    def __init__(self):
        self.done = False

    def on_step_begin(self, trainer):
        if self.done or not limit_mib or limited_rank not in (-1, rank):
            return
        self.done = True
        held = psutil.Process().memory_info().vms
        resource.setrlimit(resource.RLIMIT_AS, (held + limit_mib * 2**20, resource.RLIM_INFINITY))  # the soft limit


lines = []


class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())


logging.getLogger("trainer").addHandler(Keep())
trainer = Trainer(model, args, train_dataset=Data(), loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[Limit()])
status, code, error = "completed", 0, ""
try:
    state = trainer.fit()
    status = state.status
except TrainerError as exc:
    status, code, error = "failed", exc.exit_code, str(exc)
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))  # to write the results
np.savez(os.path.join(out, f"params-rank{rank}.npz"), **{k: v.numpy() for k, v in model.state_dict().items()})
with open(os.path.join(out, f"result-rank{rank}.json"), "w") as f:
    json.dump({"status": status, "exit_code": code, "error": error, "batch": batch, "accum": accum,
               "micro_batch": trainer.state.train_micro_batch_size or batch, "world_size": world,
               "global_batch": trainer.state.global_batch_size, "samples_seen": trainer.state.samples_seen,
               "global_step": trainer.state.global_step, "lines": lines,
               "peak_gpu_allocated_mb": max([r.get("peak_gpu_allocated_mb", 0) for r in trainer.state.log_history] or [0]),
               "losses": [r["loss"] for r in trainer.state.log_history if "loss" in r]}, f)
sys.exit(code)
