"""EarlyStopping in real Trainer runs: stopping after `patience` evaluations, and its checkpointed state."""

import doctest
import json

import paddle
import pytest
from helpers import ToyDataset, make_mlp

import callbacks.early_stopping
from callbacks import EarlyStopping
from trainer import Trainer, TrainingArguments
from trainer.errors import ConfigError


def make_trainer(out, stopper, scores=None, max_steps=40, learning_rate=0.05, **overrides):
    """Evaluates every 2 steps; with ``scores``, compute_metrics reports ``eval_score = scores[global_step]``."""
    values = dict(output_dir=str(out), per_device_train_batch_size=8, max_steps=max_steps, learning_rate=learning_rate,
                  report_to=[], evaluation_strategy="steps", eval_steps=2, save_strategy="no")
    values.update(overrides)
    t = Trainer(make_mlp(), TrainingArguments(**values), train_dataset=ToyDataset(64), eval_dataset=ToyDataset(32, seed=1),
                loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[stopper] if stopper else [])
    if scores is not None:
        t.compute_metrics = lambda pred: {"score": scores[t.state.global_step]}
    return t


def test_stops_after_patience_evaluations_without_improvement(tmp_path):
    # a learning rate this small leaves eval_loss practically still: no change beats min_delta
    stopper = EarlyStopping(patience=3, min_delta=1e-3)
    t = make_trainer(tmp_path, stopper, learning_rate=1e-9)
    state = t.fit()
    # evaluations at steps 2 (sets best), 4, 6, 8 (third without improvement): stop at 8 of 40
    assert state.status == "stopped" and state.global_step == 8
    assert stopper.best_step == 2 and stopper.wait == 3 and stopper.stopped_step == 8
    assert stopper.mode == "min" and "eval_loss" in state.metrics


def test_improvements_reset_the_count(tmp_path):
    scores = {2: 1.0, 4: 0.9, 6: 0.95, 8: 0.85, 10: 0.9, 12: 0.86, 14: 0.851, 16: 0.7}
    stopper = EarlyStopping(metric="eval_score", mode="min", patience=3, min_delta=0.0)
    state = make_trainer(tmp_path, stopper, scores).fit()
    assert state.global_step == 14 and state.status == "stopped"
    assert (stopper.best, stopper.best_step, stopper.wait) == (0.85, 8, 3)


def test_mode_max_and_min_delta(tmp_path):
    # accuracy-like: higher is better; +0.005 steps do not beat min_delta=0.01
    scores = {2: 0.5, 4: 0.6, 6: 0.605, 8: 0.61, 10: 0.9}
    stopper = EarlyStopping(metric="score", patience=2, min_delta=0.01)
    assert stopper.mode == "max"
    state = make_trainer(tmp_path, stopper, scores).fit()
    assert state.global_step == 8 and stopper.best == 0.6


def test_state_round_trip_through_a_checkpoint(tmp_path):
    scores = {s: v for s, v in zip(range(2, 41, 2), [1.0, 0.9, 0.95, 0.97, 0.99] + [0.5] * 15)}
    full_stopper = EarlyStopping(metric="eval_score", mode="min", patience=3)
    full = make_trainer(tmp_path / "full", full_stopper, scores, save_strategy="steps", save_steps=8).fit()
    assert full.global_step == 10  # best 0.9 at 4; no better at 6, 8, 10
    ckpt = tmp_path / "full" / "checkpoints" / "step-8"
    with open(ckpt / "trainer.json") as f:
        saved = json.load(f)["callbacks"]["EarlyStopping"]
    assert saved == {"metric": "eval_score", "mode": "min", "best": 0.9, "best_step": 4, "wait": 2, "stopped_step": None}
    # a fresh callback in a fresh trainer picks up best and wait, so it stops at step 10 too (not at 16)
    stopper = EarlyStopping(metric="eval_score", mode="min", patience=3)
    t = make_trainer(tmp_path / "resumed", stopper, scores)
    state = t.fit(resume_from_checkpoint=str(ckpt))
    assert state.global_step == 10 and state.status == "stopped"
    assert stopper.state_dict() == full_stopper.state_dict()


def test_missing_metric_names_what_is_there(tmp_path):
    t = make_trainer(tmp_path, EarlyStopping(metric="eval_bleu"))
    with pytest.raises(ConfigError, match=r"'eval_bleu' is not in the evaluation metrics \(eval_loss, eval_samples\)"):
        t.fit()  # a deliberate ConfigError keeps its type (exit code 2) through the callback dispatcher
    assert t.state.global_step == 2  # failed at the first evaluation


def test_evaluate_outside_fit_does_not_count(tmp_path):
    stopper = EarlyStopping(patience=1)
    t = make_trainer(tmp_path, stopper)
    t.evaluate()
    t.evaluate()
    assert stopper.best is None and stopper.wait == 0 and not t.state.should_stop


def test_warns_when_nothing_evaluates(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="trainer"):
        make_trainer(tmp_path, EarlyStopping(), max_steps=2, evaluation_strategy="no").fit()
    assert "evaluation_strategy='no'" in caplog.text


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "best"}, r"mode='best'"),
    ({"patience": 0}, r"patience=0"),
    ({"min_delta": -1}, r"min_delta=-1"),
    ({"metric": ""}, r"metric=''"),
])
def test_bad_options(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        EarlyStopping(**kwargs)


def test_docstring_example():
    assert doctest.testmod(callbacks.early_stopping).failed == 0
