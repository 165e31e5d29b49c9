"""Worker for the kill -9 trials: saves often (async), resumes with 'auto'.

usage: kill_toy.py OUT_DIR [resume]
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

from trainer import Trainer, TrainingArguments  # noqa: E402

STEPS = 48


class Paced(ToyDataset):
    def __getitem__(self, i):
        time.sleep(0.0003)
        return super().__getitem__(i)


def main(out, resume):
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(8, 384), paddle.nn.ReLU(), paddle.nn.Dropout(0.1),
                                 paddle.nn.Linear(384, 384), paddle.nn.ReLU(), paddle.nn.Linear(384, 2))
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=8, max_steps=STEPS, learning_rate=0.003,
                             save_steps=3, save_total_limit=2, report_to=[], evaluation_strategy="no")
    trainer = Trainer(model, args, train_dataset=Paced(100), loss_fn=paddle.nn.CrossEntropyLoss())
    state = trainer.fit(resume_from_checkpoint="auto" if resume else None)
    np.savez(os.path.join(out, "final.npz"), **{k: v.numpy() for k, v in model.state_dict().items()},
             step=state.global_step)


if __name__ == "__main__":
    main(sys.argv[1], len(sys.argv) > 2)
