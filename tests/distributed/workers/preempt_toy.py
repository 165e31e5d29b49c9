"""Worker for the preemption tests: a slow toy run that marks step 20 and can be signalled.

usage: preempt_toy.py OUT_DIR MAX_STEPS [resume]
"""

import os
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))
sys.path.append(TESTS)

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from helpers import ToyDataset  # noqa: E402

from callbacks import Callback  # noqa: E402
from callbacks.preemption import Preemption  # noqa: E402
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


def main(out, max_steps, resume):
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Dropout(0.2), paddle.nn.Linear(16, 2))
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=max_steps, learning_rate=0.01,
                             save_steps=1000, report_to=[], evaluation_strategy="no")
    trainer = Trainer(model, args, train_dataset=Slow(200), loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[Mark(out)])
    state = trainer.fit(resume_from_checkpoint="auto" if resume else None)
    np.savez(os.path.join(out, f"final-rank{dist.get_rank()}-{state.status}.npz"),
             **{k: v.numpy() for k, v in model.state_dict().items()}, step=state.global_step)
    code = trainer.callbacks.get(Preemption).exit_code
    with open(os.path.join(out, f"code-rank{dist.get_rank()}"), "w") as f:
        f.write(str(code))
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), len(sys.argv) > 3)
