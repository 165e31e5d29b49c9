"""Worker for the post-fit tests: a documented script that simply ends after fit(), or calls
evaluate() (or predict()) after it, as docs/getting-started.md shows; it never calls sys.exit.

usage: post_fit_toy.py OUT_DIR none|evaluate|predict
"""

import os
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))
sys.path.append(TESTS)

import paddle  # noqa: E402
from helpers import ToyDataset  # noqa: E402

from callbacks import Callback  # noqa: E402
from trainer import Trainer, TrainingArguments  # noqa: E402
from trainer import distributed as dist  # noqa: E402


class Slow(ToyDataset):
    def __getitem__(self, i):
        time.sleep(0.002)
        return super().__getitem__(i)


class Mark(Callback):
    def __init__(self, out):
        self.out = out

    def on_step_end(self, trainer):
        if trainer.state.global_step == 20:
            with open(os.path.join(self.out, f"at-20-rank{dist.get_rank()}"), "w") as f:
                f.write(str(os.getpid()))


out, after = sys.argv[1], sys.argv[2]
paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 2))
args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=2000, learning_rate=0.01,
                         save_steps=1000, report_to=[], evaluation_strategy="no")
trainer = Trainer(model, args, train_dataset=Slow(200), eval_dataset=ToyDataset(40),
                  loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[Mark(out)])
state = trainer.fit()
with open(os.path.join(out, f"fit-rank{dist.get_rank()}"), "w") as f:
    f.write(f"{state.status} {state.exit_code}")
if after == "evaluate":
    print(trainer.evaluate())
elif after == "predict":
    print(trainer.predict(ToyDataset(40)).metrics)
with open(os.path.join(out, f"after-rank{dist.get_rank()}"), "w") as f:  # reached only when nothing raised
    f.write("ran on")
