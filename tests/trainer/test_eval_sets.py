"""Several evaluation sets: ``eval_dataset={name: dataset}`` evaluates each with the prefix ``eval_<name>``,
in one evaluation; metric_for_best_model, load_best_model_at_end and EarlyStopping follow the set they name."""

import json

import numpy as np
import paddle
import pytest
from helpers import ToyDataset, make_mlp

from callbacks import EarlyStopping
from trainer import Trainer, TrainingArguments
from trainer.errors import ConfigError


def accuracy(pred):
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


def test_evaluate_without_argument_evaluates_every_set_with_its_prefix(tmp_path):
    sets = {"val": ToyDataset(37, seed=9), "hard": ToyDataset(20, seed=4)}
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=8, report_to=["jsonl"])
    trainer = Trainer(make_mlp(seed=5), args, eval_dataset=sets, loss_fn=paddle.nn.CrossEntropyLoss(),
                      compute_metrics=accuracy)
    metrics = trainer.evaluate()
    for name, data in sets.items():
        alone = trainer.evaluate(eval_dataset=data)  # one dataset: as before, eval_*
        assert metrics[f"eval_{name}_loss"] == pytest.approx(alone["eval_loss"], abs=1e-7)
        assert metrics[f"eval_{name}_accuracy"] == alone["eval_accuracy"]
        assert metrics[f"eval_{name}_samples"] == len(data)
        assert f"eval_{name}_runtime" in metrics
    assert not any(k.startswith("eval_loss") for k in metrics)
    with open(tmp_path / "metrics.jsonl") as f:
        first = json.loads(f.readline())  # one record holds every set
    assert {"eval_val_loss", "eval_hard_loss", "eval_val_accuracy", "eval_hard_accuracy"} <= set(first)


def test_best_model_and_early_stopping_follow_the_named_set(tmp_path):
    """Set ``a`` improves at every evaluation, set ``b`` peaks at step 4: the best checkpoint, the loaded weights
    and the stop follow ``b`` (the set named), not ``a``."""
    scores = {"a": {2: 0.1, 4: 0.2, 6: 0.3, 8: 0.4, 10: 0.5}, "b": {2: 0.5, 4: 0.9, 6: 0.6, 8: 0.55, 10: 0.5}}
    sizes = {32: "a", 16: "b"}
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=20, learning_rate=0.05,
                             report_to=[], evaluation_strategy="steps", eval_steps=2, save_steps=2,
                             metric_for_best_model="b_score", load_best_model_at_end=True, save_total_limit=2)
    stopper = EarlyStopping(metric="eval_b_score", patience=2)
    trainer = Trainer(make_mlp(), args, train_dataset=ToyDataset(64), loss_fn=paddle.nn.CrossEntropyLoss(),
                      eval_dataset={"a": ToyDataset(32, seed=1), "b": ToyDataset(16, seed=2)}, callbacks=[stopper])
    trainer.compute_metrics = lambda pred: {"score": scores[sizes[len(pred.label_ids)]][trainer.state.global_step]}
    state = trainer.fit()
    assert state.status == "stopped" and state.global_step == 8  # b: no better than step 4 at 6 and 8
    assert stopper.best_step == 4 and state.best_metric == 0.9
    assert state.best_checkpoint.endswith("step-4")
    from trainer.checkpoint.manifest import np_load_file

    best = np_load_file(f"{state.best_checkpoint}/model.safetensors")
    for key, value in trainer.model.state_dict().items():  # load_best_model_at_end: step 4's weights
        np.testing.assert_array_equal(value.numpy(), best[key])
    evals = [r for r in state.log_history if "eval_a_score" in r]
    assert [r["step"] for r in evals] == [2, 4, 6, 8] and all("eval_b_score" in r for r in evals)


def test_the_loss_of_several_sets_must_be_named(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], evaluation_strategy="steps", eval_steps=2,
                             save_steps=2, load_best_model_at_end=True)  # metric_for_best_model: loss
    with pytest.raises(ConfigError, match="name one of eval_val_loss, eval_test_loss"):
        Trainer(make_mlp(), args, eval_dataset={"val": ToyDataset(8), "test": ToyDataset(8)})
    with pytest.raises(ConfigError, match="eval_dataset name 'my set'"):
        Trainer(make_mlp(), TrainingArguments(output_dir=str(tmp_path), report_to=[]), eval_dataset={"my set": ToyDataset(8)})
