"""Worker for tests/trainer/test_host_memory.py: train a small model with the default callbacks for a few hundred
steps and record this rank's resident set after every step (``/proc/self/statm``: one read, no device work).

usage: host_memory_toy.py OUT_DIR JSON_OPTIONS
options: steps, sharding ("" or "stage1"), recompute (bool), leak_kib (a deliberate leak of that many KiB a step,
kept in a list: what the test must catch), hidden, depth.
"""

import json
import os
import resource
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))  # the repository first: trainer is the package, not tests/trainer
sys.path.append(os.path.join(TESTS, "distributed", "workers"))

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from callbacks import Callback  # noqa: E402
from trainer import Trainer, TrainingArguments  # noqa: E402
from trainer import distributed as dist  # noqa: E402

from parallel_toy import Blocks  # noqa: E402  (the parity tests' model: a LayerList of blocks)

PAGE_KIB = resource.getpagesize() / 1024


def rss_kib() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * PAGE_KIB


class Data(paddle.io.Dataset):
    def __init__(self, n, features, classes=4):
        rng = np.random.RandomState(3)
        self.x = rng.randn(n, features).astype("float32")
        self.y = rng.randint(0, classes, size=n).astype("int64")

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Record(Callback):
    def __init__(self, leak_kib):
        self.rss, self.leak_kib, self.kept = [], leak_kib, []

    def on_step_end(self, trainer):
        if self.leak_kib:
            self.kept.append(np.ones(int(self.leak_kib * 256), dtype="float32"))  # touched: resident
        self.rss.append(rss_kib())


def main(out_dir, options):
    steps, batch, features = options.get("steps", 400), 16, 64
    args = TrainingArguments(output_dir=os.path.join(out_dir, "run"), per_device_train_batch_size=batch,
                             max_steps=steps, logging_steps=10, learning_rate=1e-3, device="cpu", seed=0,
                             report_to=[], save_strategy="no", sharding=options.get("sharding", ""),
                             recompute=options.get("recompute", False))
    paddle.seed(0)
    model = Blocks(features, options.get("hidden", 128), options.get("depth", 4))
    record = Record(options.get("leak_kib", 0))
    trainer = Trainer(model, args, train_dataset=Data(batch * dist.get_world_size() * steps, features),
                      loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[record])
    trainer.fit()
    with open(os.path.join(out_dir, f"rss-rank{dist.get_rank()}.json"), "w", encoding="utf-8") as f:
        json.dump({"rss_kib": record.rss, "callbacks": [type(c).__name__ for c in trainer.callbacks]}, f)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
