"""save_total_limit keeps the newest checkpoints and the best one."""

import os

import paddle
from helpers import ToyDataset, make_mlp

from trainer import Trainer, TrainingArguments


def test_rotation_keeps_newest_and_best(tmp_path):
    metric_by_step = {2: 0.9, 4: 0.5, 6: 0.6, 8: 0.7, 10: 0.4}

    class Fixed(Trainer):
        def evaluate(self, eval_dataset=None, metric_key_prefix="eval"):
            from trainer import Event

            self.fire(Event.EVAL_BEGIN)
            self.state.metrics = {"eval_score": metric_by_step[self.state.global_step]}
            self.fire(Event.EVAL_END)
            return self.state.metrics

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=10,
                             evaluation_strategy="steps", eval_steps=2, save_steps=2, save_total_limit=2,
                             metric_for_best_model="eval_score", greater_is_better=True, report_to=[])
    trainer = Fixed(make_mlp(), args, train_dataset=ToyDataset(32), eval_dataset=ToyDataset(8),
                    loss_fn=paddle.nn.CrossEntropyLoss())
    trainer.fit()
    kept = sorted(d for d in os.listdir(tmp_path / "checkpoints") if d.startswith("step-"))
    assert kept == ["step-10", "step-2", "step-8"]
    assert trainer.state.best_metric == 0.9
    assert trainer.state.best_checkpoint.endswith("step-2")
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-10"
    assert not [d for d in os.listdir(tmp_path / "checkpoints") if d.startswith(".")]


def test_default_limit_keeps_the_newest_three(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=12, save_steps=2,
                             evaluation_strategy="no", report_to=[])
    Trainer(make_mlp(), args, train_dataset=ToyDataset(32), loss_fn=paddle.nn.CrossEntropyLoss()).fit()
    kept = sorted((d for d in os.listdir(tmp_path / "checkpoints") if d.startswith("step-")), key=lambda d: int(d[5:]))
    assert kept == ["step-8", "step-10", "step-12"]
