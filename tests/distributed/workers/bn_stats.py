"""Under paddle.distributed.launch: ranks whose BatchNorm statistics differ evaluate and save."""

import json
import os
import sys

import numpy as np
import paddle

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from helpers import ToyDataset  # noqa: E402

from trainer import Trainer, TrainingArguments  # noqa: E402
from trainer import distributed as dist  # noqa: E402

out = sys.argv[1]
rank = dist.get_rank()
paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(8, 4), paddle.nn.BatchNorm1D(4), paddle.nn.Linear(4, 2))
bn = model[1]
# as after training on different shards: each rank's running statistics are its own
bn._mean.set_value(paddle.full([4], float(rank + 1)))
bn._variance.set_value(paddle.full([4], float(2 * rank + 1)))
args = TrainingArguments(output_dir=os.path.join(out, "run"), per_device_eval_batch_size=4, report_to=[])
trainer = Trainer(model, args, eval_dataset=ToyDataset(16), train_dataset=ToyDataset(16),
                  loss_fn=paddle.nn.CrossEntropyLoss())
metrics = trainer.evaluate()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"mean": bn._mean.numpy().tolist(), "variance": bn._variance.numpy().tolist(),
               "eval_loss": metrics["eval_loss"]}, f)
