"""A PaddleNLP run resumes exactly: PaddleNLP's recipe (its data order, its own LR schedule) is a closed form of
(seed, epoch, step), so a run stopped at step 10 and resumed from its checkpoint logs every later record as the
uninterrupted run does (loss, learning_rate, eval metrics), on one process."""

import importlib.util
import os
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("paddlenlp") is None, reason="paddlenlp not installed")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compat_helpers import make_tiny_ernie, write_data  # noqa: E402

from callbacks import Callback  # noqa: E402


class StopAt(Callback):
    """Stops the run at ``step`` (a stopped run saves its last step); records every step trained."""

    def __init__(self, step=None):
        self.step, self.trained = step, []

    def on_step_end(self, trainer):
        self.trained.append(trainer.state.global_step)
        if trainer.state.global_step == self.step:
            trainer.state.should_stop = True


def _run(tmp, ernie, data, out, stop=None, resume=False):
    import json

    from paddlenlp.data import DataCollatorWithPadding
    from paddlenlp.datasets import MapDataset
    from paddlenlp.trainer import TrainingArguments, set_seed
    from paddlenlp.transformers import AutoModelForSequenceClassification, AutoTokenizer

    from trainer import Trainer

    args = TrainingArguments(output_dir=out, num_train_epochs=2, learning_rate=2e-3, per_device_train_batch_size=16,
                             per_device_eval_batch_size=24, evaluation_strategy="epoch", logging_steps=2,
                             save_strategy="steps", save_steps=1000, warmup_ratio=0.15, weight_decay=0.01,
                             report_to=["none"], disable_tqdm=True, device="cpu", seed=7,
                             resume_from_checkpoint="auto" if resume else None)
    set_seed(args.seed)
    marks = StopAt(stop)
    tokenizer = AutoTokenizer.from_pretrained(ernie)
    model = AutoModelForSequenceClassification.from_pretrained(ernie, num_classes=2)

    def read(split):
        with open(os.path.join(data, f"{split}.jsonl"), encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        return MapDataset([{**tokenizer(r["sentence"], max_seq_len=32), "labels": r["label"]} for r in rows])

    trainer = Trainer(model=model, args=args, data_collator=DataCollatorWithPadding(tokenizer),
                      train_dataset=read("train"), eval_dataset=read("dev"), tokenizer=tokenizer,
                      callbacks=[marks])
    trainer.train()
    return [dict(r) for r in trainer.state.log_history], marks.trained


def test_a_stopped_paddlenlp_run_resumes_to_the_same_numbers(tmp_path):
    ernie, data = make_tiny_ernie(str(tmp_path / "ernie")), write_data(str(tmp_path / "data"), n_train=200, n_dev=64)
    whole, _ = _run(tmp_path, ernie, data, str(tmp_path / "whole"))
    _, first = _run(tmp_path, ernie, data, str(tmp_path / "parts"), stop=10)
    resumed, second = _run(tmp_path, ernie, data, str(tmp_path / "parts"), resume=True)
    assert first[-1] == 10 and second[0] == 11  # stopped at 10; the second run trained from step 11 on

    def by_step(history):
        return {(r["step"], "eval_loss" in r): r for r in history if "loss" in r or "eval_loss" in r}

    a, b = by_step(whole), by_step(resumed)
    later = [k for k in a if k[0] > 10]
    assert len(later) > 5 and all(k in b for k in later), (sorted(a), sorted(b))
    for k in later:
        for key in ("loss", "learning_rate", "eval_loss", "eval_accuracy"):
            if key in a[k]:
                assert abs(a[k][key] - b[k][key]) <= 1e-6, (k, key, a[k][key], b[k][key])
