"""LRWarmup and trainer.optim.schedules: the learning rate read from the optimizer in real Trainer runs."""

import doctest
import json
import math

import numpy as np
import paddle
import pytest
from helpers import ToyDataset, make_mlp

import callbacks.lr_warmup
import trainer.optim.schedules
from callbacks import Callback, LRWarmup
from trainer import Trainer, TrainingArguments
from trainer.errors import ConfigError
from trainer.optim.schedules import WarmupDecay, WithWarmup


class RecordLR(Callback):
    """The optimizer's LR at the start of each step (what the step uses) and at its end (what comes next)."""

    def __init__(self):
        self.used, self.at_end = [], []

    def on_step_begin(self, trainer):
        self.used.append(trainer.optimizer.get_lr())

    def on_step_end(self, trainer):
        self.at_end.append(trainer.optimizer.get_lr())


def fit(tmp_path, callbacks=(), n=64, optimizer=None, lr_scheduler=None, resume=None, **overrides):
    values = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, learning_rate=0.1, optim="sgd",
                  report_to=[], evaluation_strategy="no", save_strategy="no")
    values.update(overrides)
    model = make_mlp()
    if optimizer == "sgd":
        optimizer = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    rec = RecordLR()
    t = Trainer(model, TrainingArguments(**values), train_dataset=ToyDataset(n), loss_fn=paddle.nn.CrossEntropyLoss(),
                optimizer=optimizer, lr_scheduler=lr_scheduler, callbacks=[rec, *callbacks])
    t.fit(resume_from_checkpoint=resume)
    return t, rec


def test_issue_curve_linear_warmup_10_of_20(tmp_path):
    t, rec = fit(tmp_path, warmup_steps=10, lr_scheduler_type="linear", learning_rate=0.1, max_steps=20)
    lrs = rec.at_end
    print("LR at on_step_end:", [round(v, 5) for v in lrs])
    assert len(lrs) == 20
    assert all(b > a for a, b in zip(lrs[:10], lrs[1:10])), "rises for 10 steps"
    assert lrs[9] == pytest.approx(0.1, abs=1e-12), "reaches 0.1 at step 10"
    assert all(b < a for a, b in zip(lrs[9:], lrs[10:])), "then falls"
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)
    expected = [0.1 * (k + 1) / 11 if k < 10 else 0.1 * (1 - (k - 10) / 10) for k in range(1, 21)]
    np.testing.assert_allclose(lrs, expected, rtol=0, atol=1e-12)
    # the LR each step used: never 0, peak exactly once (step 11)
    assert rec.used[0] == pytest.approx(0.1 / 11) and max(rec.used) == pytest.approx(0.1)
    assert sum(v == pytest.approx(0.1) for v in rec.used) == 1
    # one warmup: the trainer's WarmupDecay carries it, LRWarmup (switched on by the args) did not wrap it
    assert type(t.lr_scheduler) is WarmupDecay and t.lr_scheduler.warmup_steps == 10
    warm = t.callbacks.get(LRWarmup)
    assert warm is not None and warm.applied_to == "WarmupDecay(linear)"


def test_cosine_after_warmup(tmp_path):
    _, rec = fit(tmp_path, warmup_steps=4, lr_scheduler_type="cosine", max_steps=12)
    lrs = rec.at_end
    expected = [0.1 * (k + 1) / 5 if k < 4 else 0.1 * 0.5 * (1 + math.cos(math.pi * (k - 4) / 8)) for k in range(1, 13)]
    np.testing.assert_allclose(lrs, expected, atol=1e-12)
    assert lrs[3] == pytest.approx(0.1) and lrs[7] == pytest.approx(0.05) and lrs[-1] == pytest.approx(0.0, abs=1e-12)


def test_multistep_epoch_milestones(tmp_path):
    # 16 samples / batch 4 = 4 optimizer steps per epoch; decay at epochs 2 and 3 = steps 8 and 12
    _, rec = fit(tmp_path, n=16, num_train_epochs=4, warmup_steps=2, lr_scheduler_type="multistep",
                 lr_milestones=[2, 3], lr_gamma=0.1)
    lrs = rec.used  # the LR of steps 1..16
    expected = [0.1 / 3, 0.2 / 3] + [0.1] * 6 + [0.01] * 4 + [0.001] * 4
    np.testing.assert_allclose(lrs, expected, rtol=1e-12)


def test_step_decay_every_epoch_counts_from_the_start(tmp_path):
    # 2 steps per epoch, halve every epoch; warmup 1 step only overrides the first step
    _, rec = fit(tmp_path, n=8, per_device_train_batch_size=4, num_train_epochs=3, warmup_steps=1,
                 lr_scheduler_type="step", lr_step_size=1, lr_gamma=0.5)
    np.testing.assert_allclose(rec.used, [0.05, 0.1, 0.05, 0.05, 0.025, 0.025], rtol=1e-12)


def test_warmup_ratio_and_gradient_accumulation_count_optimizer_steps(tmp_path):
    # 20 optimizer steps of 2 micro-batches; warmup_ratio 0.25 -> 5 optimizer steps
    t, rec = fit(tmp_path, warmup_ratio=0.25, lr_scheduler_type="constant", max_steps=20, gradient_accumulation_steps=2)
    assert t.lr_scheduler.warmup_steps == 5 and len(rec.used) == 20
    np.testing.assert_allclose(rec.used, [0.1 * k / 6 for k in range(1, 6)] + [0.1] * 15, rtol=1e-12)


def test_linear_scaling_rule_applied_once(tmp_path):
    # global batch = 4 per device x 1 process x 2 accumulation = 8; reference 4 -> peak 0.2
    t, rec = fit(tmp_path, warmup_steps=3, lr_scheduler_type="constant", max_steps=6, gradient_accumulation_steps=2,
                 scale_lr_by_batch=4)
    assert t.state.global_batch_size == 8 and t.lr_scheduler.lr_scale == 2.0
    np.testing.assert_allclose(rec.used, [0.05, 0.1, 0.15, 0.2, 0.2, 0.2], rtol=1e-12)
    # with the user's optimizer (LR 0.05) the rule scales that LR, once, in the wrapper
    t, rec = fit(tmp_path / "user", optimizer="sgd", warmup_steps=0, max_steps=3, gradient_accumulation_steps=2,
                 scale_lr_by_batch=4)
    assert isinstance(t.lr_scheduler, WithWarmup)
    np.testing.assert_allclose(rec.used, [0.1, 0.1, 0.1], rtol=1e-12)


def test_user_scheduler_is_wrapped_and_keeps_its_clock(tmp_path):
    inner = paddle.optimizer.lr.MultiStepDecay(0.1, milestones=[6], gamma=0.1)
    t, rec = fit(tmp_path, lr_scheduler=inner, warmup_steps=3, max_steps=8)
    assert isinstance(t.lr_scheduler, WithWarmup) and t.lr_scheduler.inner is inner
    np.testing.assert_allclose(rec.used, [0.025, 0.05, 0.075, 0.1, 0.1, 0.1, 0.01, 0.01], rtol=1e-12)


def test_user_optimizer_with_constant_lr_gets_warmup_that_moves_parameters(tmp_path):
    t, rec = fit(tmp_path, optimizer="sgd", warmup_steps=4, max_steps=6)
    np.testing.assert_allclose(rec.used, [0.01, 0.02, 0.03, 0.04, 0.05, 0.05], rtol=1e-12)
    # the optimizer really uses the wrapper: one SGD step at lr changes w by exactly -lr * grad
    lin = paddle.nn.Linear(1, 1, bias_attr=False)
    paddle.assign(paddle.ones([1, 1]), lin.weight)
    opt = paddle.optimizer.SGD(learning_rate=1.0, parameters=lin.parameters())
    opt.set_lr_scheduler(WithWarmup(1.0, warmup_steps=3))
    lin(paddle.ones([1, 1])).sum().backward()
    opt.step()
    assert float(lin.weight.numpy()[0, 0]) == pytest.approx(1 - 0.25, abs=1e-6)


def resume_run(out, resume=None, scheduler=False):
    sched = paddle.optimizer.lr.MultiStepDecay(0.1, milestones=[14], gamma=0.1) if scheduler else None
    return fit(out, lr_scheduler=sched, resume=resume, warmup_steps=8, lr_scheduler_type="cosine", max_steps=20,
               save_strategy="steps", save_steps=10)


@pytest.mark.parametrize("scheduler", [False, True], ids=["trainer-built", "user-scheduler-wrapped"])
def test_resume_continues_the_schedule_exactly(tmp_path, scheduler):
    full, rec_full = resume_run(tmp_path / "full", scheduler=scheduler)
    ckpt = tmp_path / "full" / "checkpoints" / "step-10"
    with open(ckpt / "trainer.json") as f:
        meta = json.load(f)
    assert meta["callbacks"]["LRWarmup"]["warmup_steps"] == 8
    resumed, rec = resume_run(tmp_path / "resumed", resume=str(ckpt), scheduler=scheduler)
    assert resumed.state.global_step == 20
    assert rec.used == rec_full.used[10:]          # exactly, not approximately
    assert rec.at_end == rec_full.at_end[10:]
    assert type(resumed.lr_scheduler) is type(full.lr_scheduler)
    if scheduler:
        assert resumed.lr_scheduler.inner.last_epoch == full.lr_scheduler.inner.last_epoch == 20


def test_resume_with_other_warmup_is_refused(tmp_path):
    # a changed warmup would change the schedule of the resumed run: trainer.checkpoint.resume refuses it
    resume_run(tmp_path / "a")
    args = dict(warmup_steps=4, lr_scheduler_type="cosine", max_steps=20, save_strategy="no")
    with pytest.raises(ConfigError, match=r"resume: warmup_steps was 8 in checkpoint .*step-10, this run has 4"):
        fit(tmp_path / "b", resume=str(tmp_path / "a" / "checkpoints" / "step-10"), **args)


def test_explicit_option_overrides_the_arguments_without_double_warmup(tmp_path):
    t, rec = fit(tmp_path, callbacks=[LRWarmup(warmup_steps=2)], lr_scheduler_type="constant", max_steps=4)
    assert type(t.lr_scheduler) is WarmupDecay and t.lr_scheduler.warmup_steps == 2
    np.testing.assert_allclose(rec.used, [0.1 / 3, 0.2 / 3, 0.1, 0.1], rtol=1e-12)


def test_switched_on_by_the_arguments_only():
    on = Trainer(make_mlp(), TrainingArguments(report_to=[], warmup_ratio=0.1))
    off = Trainer(make_mlp(), TrainingArguments(report_to=[]))
    assert on.callbacks.get(LRWarmup) is not None and off.callbacks.get(LRWarmup) is None


def test_bad_options_and_unwrappable_scheduler(tmp_path):
    with pytest.raises(ConfigError, match=r"LRWarmup\(warmup_steps=-1\)"):
        LRWarmup(warmup_steps=-1)
    with pytest.raises(ConfigError, match=r"warmup_ratio=1.5"):
        LRWarmup(warmup_ratio=1.5)
    plateau = paddle.optimizer.lr.ReduceOnPlateau(0.1)
    with pytest.raises(ConfigError, match="ReduceOnPlateau cannot be wrapped"):
        fit(tmp_path, lr_scheduler=plateau, warmup_steps=2, max_steps=2)


def test_docstring_examples():
    for module in (trainer.optim.schedules, callbacks.lr_warmup):
        assert doctest.testmod(module).failed == 0
