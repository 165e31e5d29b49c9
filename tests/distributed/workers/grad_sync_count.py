"""Worker of tests/parallel/test_recompute_dp.py: a tiny PaddleNLP ERNIE, which recomputes through its own
(reentrant) switch, trains under DataParallel with gradient accumulation; counts the all-reduces Python issues
between a step's begin and its optimizer step (``paddle.distributed.all_reduce``, which paddle's
``fused_allreduce_gradients`` calls once per coalesced buffer; DataParallel's reducer all-reduces in C++, unseen).

usage: grad_sync_count.py OUT_DIR ACCUMULATION RECOMPUTE(0|1)

Writes result-rankR.json: the count per step, the final parameters' checksum.
"""

import json
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))  # the repository first: trainer is the package, not tests/trainer

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.distributed  # noqa: E402
from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification  # noqa: E402

from callbacks import Callback  # noqa: E402
from trainer import Trainer, TrainingArguments  # noqa: E402

out, accumulation, recompute = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))


class CountAllReduces(Callback):
    """Counts paddle.distributed.all_reduce calls from on_step_begin to on_optimizer_step_begin (calls go through)."""

    def __init__(self):
        self.per_step, self.counting, self.count = [], False, 0
        issue = paddle.distributed.all_reduce

        def counted(*args, **kwargs):
            self.count += self.counting
            return issue(*args, **kwargs)

        paddle.distributed.all_reduce = counted

    def on_step_begin(self, trainer):
        self.counting, self.count = True, 0

    def on_optimizer_step_begin(self, trainer):
        self.per_step.append(self.count)
        self.counting = False


class Tokens(paddle.io.Dataset):
    def __init__(self, n=96, length=12):
        rng = np.random.RandomState(0)
        self.ids = rng.randint(1, 64, size=(n, length)).astype("int64")
        self.labels = (self.ids[:, 0] % 2).astype("int64")

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


paddle.seed(0)
model = ErnieForSequenceClassification(ErnieConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                                   num_attention_heads=2, intermediate_size=64, num_labels=2))
args = TrainingArguments(output_dir=out, max_steps=3, per_device_train_batch_size=4,
                         gradient_accumulation_steps=accumulation, recompute=recompute, report_to=[],
                         save_strategy="no", evaluation_strategy="no", logging_steps=1, seed=0)
counter = CountAllReduces()
trainer = Trainer(model, args, train_dataset=Tokens(), callbacks=[counter])
trainer.fit()
with open(os.path.join(out, f"result-rank{rank}.json"), "w") as f:
    json.dump({"all_reduces_per_step": counter.per_step, "global_step": trainer.state.global_step,
               "checksum": float(sum(np.abs(p.numpy().astype("float64")).sum() for p in model.parameters()))}, f)
