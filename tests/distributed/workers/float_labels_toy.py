"""Worker: a script with float class labels (the first-hour mistake), left uncaught as a new user writes it."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from trainer import Trainer, TrainingArguments  # noqa: E402

x = np.random.RandomState(0).rand(64, 8).astype("float32")
y = np.random.RandomState(1).randint(0, 2, 64).astype("float32")  # float labels: CrossEntropyLoss wants int64
args = TrainingArguments(output_dir=sys.argv[1], max_steps=5, report_to=[])
Trainer(paddle.nn.Linear(8, 2), args, train_dataset=list(zip(x, y)), loss_fn=paddle.nn.CrossEntropyLoss()).fit()
