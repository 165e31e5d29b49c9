"""Real training runs for the tracker tests (tests/callbacks/test_*_tracker.py): a tiny MLP on ToyDataset
that logs every 2 steps, evaluates every 3, saves every 2, and exports its model at the end."""

from __future__ import annotations

import json
import os

import paddle
from helpers import StopAt, ToyDataset, make_mlp

from callbacks import Export
from trainer import Trainer, TrainingArguments


def train(out, report_to, max_steps=8, stop_at=None, resume=None, callbacks=(), **overrides):
    values = dict(output_dir=str(out), max_steps=max_steps, logging_steps=2, evaluation_strategy="steps", eval_steps=3,
                  save_steps=2, save_total_limit=None, report_to=list(report_to), per_device_train_batch_size=8,
                  learning_rate=0.05, device="cpu", resume_from_checkpoint=resume)
    values.update(overrides)
    extra = [StopAt(stop_at)] if stop_at else []
    trainer = Trainer(make_mlp(), TrainingArguments(**values), train_dataset=ToyDataset(), loss_fn=paddle.nn.CrossEntropyLoss(),
                      eval_dataset=ToyDataset(32, seed=1), callbacks=[Export(), *extra, *callbacks])
    trainer.fit()
    return trainer


def tracker(trainer, cls):
    return next(cb for cb in trainer.callbacks if isinstance(cb, cls))


def logged(trainer, key):
    """{step: value} of ``key`` in the trainer's log history (what the trackers were given)."""
    return {r["step"]: r[key] for r in trainer.state.log_history if key in r}


def write_results(trainer):
    """What ``ptrain run`` does after fit(): results.json, then into the trackers' runs."""
    from callbacks.tracking import log_file

    path = os.path.join(trainer.args.output_dir, "results.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"global_step": trainer.state.global_step, **trainer.state.metrics}, f)
    log_file(trainer, path)
    return path
