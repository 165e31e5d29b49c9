"""LossSpikeRecovery in real runs: a window of nan or huge batches makes the
logged loss go bad; the run rolls back to the checkpoint before the spike,
skips the batches since, finishes with a finite loss, records what it skipped,
and resumes with its state; retries are bounded."""

import doctest
import json
import math
import os

import numpy as np
import paddle
import pytest
from helpers import ToyDataset, launch, params_of
from safetensors.numpy import load_file

import callbacks.spike_recovery
from callbacks import Callback, LossSpikeRecovery
from trainer import Trainer, TrainingArguments
from trainer.data import ResumableDistributedBatchSampler
from trainer.errors import CallbackError, ConfigError, TrainingError

N, BATCH = 256, 8  # 32 steps per epoch
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "spike_toy.py")


def batches_of_epoch_0():
    sampler = ResumableDistributedBatchSampler(N, BATCH, shuffle=True, seed=0)
    sampler.set_epoch(0)
    return list(iter(sampler))


class Poisoned(ToyDataset):
    """ToyDataset whose samples in the batches of the given 1-based steps of epoch 0 are nan (or x ``scale``)."""

    def __init__(self, steps=(), scale=None):
        super().__init__(N)
        batches = batches_of_epoch_0()
        self.bad = {i for s in steps for i in batches[s - 1]}
        self.scale = scale
        self.fetched = []

    def __getitem__(self, i):
        self.fetched.append(int(i))
        x, y = super().__getitem__(i)
        if i in self.bad:
            x = np.full_like(x, np.nan) if self.scale is None else x * self.scale
        return x, y


class AtRollback(Callback):
    """Copies the model when the rollback record is logged (after LossSpikeRecovery, order 30)."""

    order = 60

    def __init__(self):
        self.params = None

    def on_log(self, trainer):
        if "rollback" in trainer.state.logs:
            self.params = params_of(trainer.model)


def make_trainer(out, data, recovery, max_steps=30, activation=paddle.nn.Tanh, **overrides):
    values = dict(output_dir=str(out), per_device_train_batch_size=BATCH, max_steps=max_steps, logging_steps=2,
                  save_steps=2, learning_rate=0.01, lr_scheduler_type="constant", report_to=["jsonl"],
                  save_total_limit=None)  # these scenarios read back older checkpoints: keep them all
    values.update(overrides)
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), activation(), paddle.nn.Linear(16, 2))
    probe = AtRollback()
    trainer = Trainer(model, TrainingArguments(**values), train_dataset=data, loss_fn=paddle.nn.CrossEntropyLoss(),
                      callbacks=[recovery, probe])
    return trainer, probe


def checkpoint_params(out, step):
    return load_file(os.path.join(out, "checkpoints", f"step-{step}", "model.safetensors"))


def records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def raised(info, kind):
    """The project error a callback raised: CallbackList wraps it in a CallbackError (its cause) today."""
    error = info.value
    error = error.__cause__ if isinstance(error, CallbackError) else error
    assert isinstance(error, kind), repr(info.value)
    return error


def all_finite(model):
    return all(np.isfinite(v).all() for v in params_of(model).values())


def test_a_nan_window_is_rolled_back_and_skipped(tmp_path):
    data = Poisoned(steps=(13, 14))
    recovery = LossSpikeRecovery()  # defaults: patience 2, 3 x the running median, no LR change
    trainer, probe = make_trainer(tmp_path, data, recovery)
    state = trainer.fit()

    # records 14 and 16 are nan (patience 2): back to step 12, the newest checkpoint before the spike
    assert state.status == "completed" and state.global_step == 30 and state.skipped_steps == 4
    (rb,) = recovery.rollbacks
    assert (rb["detected_step"], rb["first_bad_step"], rb["checkpoint_step"]) == (16, 13, 12)
    assert rb["skipped_steps"] == [13, 16] and rb["skipped_samples"] == 4 * BATCH
    assert rb["losses"] == [[14, None], [16, None]] and rb["reason"].startswith("not finite")
    # the model right after the rollback is the checkpoint's; the data went on after step 16, nothing replayed
    saved = checkpoint_params(tmp_path, 12)
    assert all(np.array_equal(probe.params[k], saved[k]) for k in saved)
    order = [i for b in batches_of_epoch_0()[:30] for i in b]
    assert data.fetched[:len(order)] == order
    # the spike's save at 14 was dropped; the recovered weights were saved at 16
    ckpts = sorted(os.listdir(os.path.join(tmp_path, "checkpoints")))
    assert "step-14" not in ckpts and "step-16" in ckpts
    after = checkpoint_params(tmp_path, 16)
    assert all(np.array_equal(after[k], saved[k]) for k in saved)
    # finished with a finite loss and finite weights; the record says what was skipped
    logged = records(tmp_path)
    assert [r["step"] for r in logged] == list(range(2, 31, 2))  # the curve stays monotone
    assert all(math.isfinite(r["loss"]) for r in logged if r["step"] > 16) and all_finite(trainer.model)
    (mark,) = [r for r in logged if "rollback" in r]
    assert mark == {**mark, "step": 16, "loss": None, "rollback": 1, "rollback_to_step": 12,
                    "rollback_skipped_steps": 4, "rollback_skipped_samples": 32, "rollback_lr_scale": 1.0}


def test_lr_factor_and_the_state_survive_a_resume(tmp_path):
    recovery = LossSpikeRecovery(lr_factor=0.5)
    trainer, _ = make_trainer(tmp_path, Poisoned(steps=(13, 14)), recovery, max_steps=24)
    trainer.fit()
    lrs = {r["step"]: r["learning_rate"] for r in records(tmp_path) if "loss" in r}
    assert lrs[16] == pytest.approx(0.01) and lrs[18] == pytest.approx(0.005) and lrs[24] == pytest.approx(0.005)
    finished = params_of(trainer.model)

    # a new process resumes from the checkpoint saved right after the rollback: same state, same LR, same result
    again = LossSpikeRecovery(lr_factor=0.5)
    resumed, _ = make_trainer(tmp_path, Poisoned(steps=(13, 14)), again, max_steps=24)
    state = resumed.fit(resume_from_checkpoint=os.path.join(tmp_path, "checkpoints", "step-16"))
    assert again.retries == 1 and again.lr_scale == 0.5 and again.rollbacks == recovery.rollbacks
    assert resumed.current_lr() == pytest.approx(0.005) and state.skipped_steps == 4
    assert all(np.array_equal(finished[k], v) for k, v in params_of(resumed.model).items())


def test_huge_inputs_above_an_absolute_threshold(tmp_path):
    recovery = LossSpikeRecovery(threshold=5.0, factor=None)
    # ReLU passes huge inputs on as huge logits (tanh would saturate them)
    trainer, _ = make_trainer(tmp_path, Poisoned(steps=(13, 14, 15, 16), scale=1e4), recovery, activation=paddle.nn.ReLU)
    state = trainer.fit()
    (rb,) = recovery.rollbacks
    assert rb["reason"] == "above the threshold 5" and rb["checkpoint_step"] == 12 and rb["skipped_steps"] == [13, 16]
    assert all(loss > 5 for _, loss in rb["losses"])
    assert state.log_history[-1]["loss"] < 1.0 and all_finite(trainer.model)


def test_one_bad_record_is_not_a_spike_but_its_save_is_dropped(tmp_path):
    recovery = LossSpikeRecovery()
    trainer, _ = make_trainer(tmp_path, Poisoned(steps=(13,), scale=1e4), recovery, max_steps=20,
                              activation=paddle.nn.ReLU)
    state = trainer.fit()
    assert recovery.rollbacks == [] and state.skipped_steps == 0 and state.status == "completed"
    losses = {r["step"]: r["loss"] for r in records(tmp_path)}
    assert losses[14] > 3 * losses[12] and losses[16] < 3 * losses[12]  # a transient: one record, then back to normal
    ckpts = os.listdir(os.path.join(tmp_path, "checkpoints"))
    assert "step-14" not in ckpts and {"step-12", "step-16"} <= set(ckpts)


def test_max_retries_exhausted_is_a_clear_error(tmp_path):
    # everything from step 9 on is nan: each rollback is followed by another bad record
    recovery = LossSpikeRecovery(patience=1, max_retries=2)
    trainer, _ = make_trainer(tmp_path, Poisoned(steps=range(9, 31)), recovery)
    with pytest.raises((CallbackError, TrainingError)) as info:
        trainer.fit()
    assert str(raised(info, TrainingError)) == ("LossSpikeRecovery: the logged loss was not finite (nan) for 1 record(s) in a row "
                          "(steps 13-14: nan) after 2 rollback(s) (max_retries=2): lower learning_rate or set "
                          "lr_factor, clip gradients with max_grad_norm, or check the data of these steps")
    assert [(r["checkpoint_step"], r["skipped_steps"]) for r in recovery.rollbacks] == [(8, [9, 10]), (10, [11, 12])]
    assert trainer.state.status == "failed"


def test_no_checkpoint_before_the_spike_is_a_clear_error(tmp_path):
    trainer, _ = make_trainer(tmp_path, Poisoned(steps=range(1, 31)), LossSpikeRecovery(), save_steps=10)
    with pytest.raises((CallbackError, TrainingError)) as info:
        trainer.fit()
    message = str(raised(info, TrainingError))
    assert "no checkpoint this run saved at or before step 0" in message and "save_total_limit 2 or more" in message


def test_needs_checkpoints(tmp_path):
    trainer, _ = make_trainer(tmp_path, Poisoned(), LossSpikeRecovery(), save_strategy="no")
    with pytest.raises((CallbackError, ConfigError)) as info:
        trainer.fit()
    assert "save_strategy='no'" in str(raised(info, ConfigError))


def test_options_and_the_relative_test():
    for bad in (dict(patience=0), dict(max_retries=-1), dict(factor=1.0), dict(lr_factor=1.5), dict(window=2),
                dict(threshold=float("nan"))):
        with pytest.raises(ConfigError, match="LossSpikeRecovery"):
            LossSpikeRecovery(**bad)
    r = LossSpikeRecovery()
    r.recent = [1.0, 0.8]
    assert r.is_bad(5.0) is None  # fewer than 3 good records: only non-finite losses count
    r.recent = [1.0, 0.8, 0.9, 100.0]
    assert r.is_bad(2.8) is None and r.is_bad(2.9) == "above 3 x the running median 0.95"  # 100 is an outlier
    assert r.is_bad(float("inf")) == "not finite (inf)"


def test_docstring_example():
    assert doctest.testmod(callbacks.spike_recovery).failed == 0


def test_two_processes_roll_back_together(tmp_path):
    out = str(tmp_path / "out")
    os.makedirs(out)
    launch(WORKER, [out], nproc=2, log_dir=str(tmp_path / "logs"))
    results = []
    for rank in (0, 1):
        with open(os.path.join(out, f"spike-rank{rank}.json")) as f:
            results.append(json.load(f))
    r0, r1 = results
    assert r0["status"] == r1["status"] == "completed" and r0["global_step"] == r1["global_step"] == 24
    assert r0["rollbacks"] == r1["rollbacks"] and len(r0["rollbacks"]) == 1
    rb = r0["rollbacks"][0]
    assert rb["checkpoint_step"] == 12 and rb["skipped_steps"] == [13, 16] and rb["skipped_samples"] == 4 * 4 * 2
    assert r0["skipped_steps"] == r1["skipped_steps"] == 4 and r0["lr"] == r1["lr"] == pytest.approx(0.005)
    assert r0["params"] == r1["params"] and math.isfinite(r0["last_loss"])
    assert all(np.isfinite(np.asarray(v)).all() for v in r0["params"].values())
