"""Worker for the 2-process tests: train the toy MLP, evaluate on an uneven set, dump results.

usage: train_toy.py OUT_DIR PER_DEVICE_BATCH
"""

import json
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))  # the repository first: trainer is the package, not tests/trainer
sys.path.append(TESTS)

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from helpers import ToyDataset, make_mlp  # noqa: E402

from trainer import Trainer, TrainingArguments  # noqa: E402
from trainer import distributed as dist  # noqa: E402


def accuracy(pred):
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


def main(out_dir, batch):
    model = make_mlp(seed=1)
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch, per_device_eval_batch_size=4,
                             num_train_epochs=3, learning_rate=0.01, logging_steps=2, report_to=["jsonl"],
                             save_strategy="no", evaluation_strategy="no")
    trainer = Trainer(model, args, train_dataset=ToyDataset(96), loss_fn=paddle.nn.CrossEntropyLoss(),
                      compute_metrics=accuracy)
    state = trainer.fit()
    metrics = trainer.evaluate(ToyDataset(37, seed=3))
    pred = trainer.predict(ToyDataset(37, seed=3))
    rank = dist.get_rank()
    np.savez(os.path.join(out_dir, f"params-rank{rank}.npz"), **{k: v.numpy() for k, v in model.state_dict().items()})
    np.save(os.path.join(out_dir, f"pred-rank{rank}.npy"), pred.predictions)
    with open(os.path.join(out_dir, f"metrics-rank{rank}.json"), "w") as f:
        json.dump({"metrics": metrics, "global_step": state.global_step, "world_size": dist.get_world_size(),
                   "losses": [r["loss"] for r in state.log_history if "loss" in r]}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
