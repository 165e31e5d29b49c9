"""NaNGuard in real Trainer runs: a batch with nan inputs never reaches the
parameters nor the optimizer's moments; a run of such batches stops training
with an error that names the step."""

import doctest

import numpy as np
import paddle
import pytest
from helpers import ToyDataset, make_mlp, params_of
from host_syncs import CountSyncs

import callbacks.nan_guard
from callbacks import AMP, Callback, NaNGuard
from callbacks.loss_scaler import DynamicLossScaler
from trainer import Trainer, TrainingArguments
from trainer.data import ResumableDistributedBatchSampler
from trainer.errors import CallbackError, ConfigError, TrainingError

BATCH = 8
N = 96  # 12 batches per epoch


class PoisonedDataset(ToyDataset):
    """ToyDataset whose samples at ``bad`` indices are all nan."""

    def __init__(self, bad=()):
        super().__init__(N)
        self.bad = set(bad)

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return (np.full_like(x, np.nan) if i in self.bad else x), y


def first_of_steps(steps, data_seed=0):
    """One index from each given 1-based step of epoch 0, in the trainer's sampling order."""
    sampler = ResumableDistributedBatchSampler(N, BATCH, shuffle=True, seed=data_seed)
    sampler.set_epoch(0)
    batches = list(iter(sampler))
    return [batches[s - 1][0] for s in steps]


def make_tanh_mlp(seed=0):
    """Tanh keeps nan flowing to the loss (ReLU turns a nan input into 0: see the ReLU test)."""
    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.Tanh(), paddle.nn.Linear(16, 2))


def make_trainer(tmp_path, bad=(), callbacks=(), model=None, **overrides):
    values = dict(output_dir=str(tmp_path), per_device_train_batch_size=BATCH, learning_rate=0.01, max_steps=10,
                  logging_steps=5, report_to=[], evaluation_strategy="no", save_strategy="no")
    values.update(overrides)
    return Trainer(model or make_tanh_mlp(), TrainingArguments(**values), train_dataset=PoisonedDataset(bad),
                   loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=list(callbacks))


def opt_tensors(trainer) -> list:
    """The optimizer's tensors (moments, velocities, beta powers), in a stable order."""
    state = trainer.optimizer.state_dict()
    return [state[k].numpy().copy() for k in sorted(state) if isinstance(state[k], paddle.Tensor)]


class Snapshots(Callback):
    order = 60

    def __init__(self):
        self.before, self.after, self.losses = [], [], []

    def on_step_begin(self, trainer):
        self.before.append((params_of(trainer.model), opt_tensors(trainer)))

    def on_optimizer_step_end(self, trainer):
        self.after.append((params_of(trainer.model), opt_tensors(trainer)))
        self.losses.append(float(trainer.state.step_loss))


def same_params(a, b):
    return all(np.array_equal(a[k], b[k]) for k in a)


def same_tensors(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def root_error(exc):
    """The TrainingError itself, or the one a CallbackError wraps."""
    return exc if isinstance(exc, TrainingError) else exc.__cause__


def test_docstring_runs():
    assert doctest.testmod(callbacks.nan_guard).failed == 0


@pytest.mark.parametrize("optim", ["adamw", "momentum", "sgd"])
def test_a_nan_batch_never_reaches_parameters_or_moments(tmp_path, optim):
    snaps = Snapshots()
    trainer = make_trainer(tmp_path, bad=first_of_steps([4]), callbacks=[NaNGuard(max_consecutive=2), snaps],
                           optim=optim, weight_decay=0.01)
    trainer.fit()
    assert np.isnan(snaps.losses[3]) and np.isfinite(np.delete(snaps.losses, 3)).all()
    (p0, o0), (p1, o1) = snaps.before[3], snaps.after[3]
    assert same_params(p0, p1)
    assert same_tensors(o0, o1)  # AdamW moments and beta powers, momentum velocities
    assert not same_params(*[snaps.before[4][0], snaps.after[4][0]])  # the next step trains again
    assert trainer.state.status == "completed" and trainer.state.global_step == 10
    assert trainer.state.skipped_steps == 1
    assert [r["skipped_steps"] for r in trainer.state.log_history] == [1, 1]
    assert all(np.isfinite(v).all() for v in params_of(trainer.model).values())
    assert trainer.grad_scaler is None  # the guard's step guard is gone after fit


def test_a_nan_input_hidden_by_relu_is_caught_by_the_gradient_check(tmp_path):
    """ReLU maps nan to 0, so the loss stays finite, but the first layer's gradient is 0 * nan."""
    snaps = Snapshots()
    trainer = make_trainer(tmp_path, bad=first_of_steps([4]), model=make_mlp(), callbacks=[NaNGuard(), snaps])
    trainer.fit()
    assert np.isfinite(snaps.losses).all()
    assert same_params(snaps.before[3][0], snaps.after[3][0]) and same_tensors(snaps.before[3][1], snaps.after[3][1])
    assert trainer.state.skipped_steps == 1


def test_a_non_finite_gradient_with_a_finite_loss_is_skipped(tmp_path):
    class InjectInf(Callback):
        order = 50

        def on_backward_end(self, trainer):
            if trainer.state.global_step + 1 == 3:
                with paddle.no_grad():
                    g = trainer.model[2].bias.grad
                    paddle.assign(paddle.full_like(g, float("inf")), output=g)

    snaps = Snapshots()
    trainer = make_trainer(tmp_path, callbacks=[NaNGuard(), InjectInf(), snaps])
    trainer.fit()
    assert np.isfinite(snaps.losses).all()
    assert same_params(snaps.before[2][0], snaps.after[2][0]) and same_tensors(snaps.before[2][1], snaps.after[2][1])
    assert trainer.state.skipped_steps == 1


@pytest.mark.parametrize("logging_steps,stopped_at", [(1, 5), (4, 8)])
def test_consecutive_nan_batches_stop_training_naming_the_step(tmp_path, logging_steps, stopped_at):
    # steps 3, 4, 5 and 6 all see nan: the third in a row is step 5
    trainer = make_trainer(tmp_path, bad=first_of_steps([3, 4, 5, 6]), callbacks=[NaNGuard(max_consecutive=3)],
                           logging_steps=logging_steps, max_steps=12)
    with pytest.raises((TrainingError, CallbackError)) as info:
        trainer.fit()
    err = root_error(info.value)
    assert isinstance(err, TrainingError)
    message = str(err)
    assert "3 optimizer steps in a row" in message and "the last of them step 5" in message
    assert f"checked at step {stopped_at}" in message
    assert "learning_rate" in message and "max_grad_norm" in message and "data" in message
    # the streak is read at logging intervals: the run stops at the first one after step 5
    assert trainer.state.global_step == stopped_at and trainer.state.status == "failed"
    assert trainer.state.skipped_steps == (3 if stopped_at == 5 else 4)


def test_a_broken_streak_does_not_stop_training(tmp_path):
    trainer = make_trainer(tmp_path, bad=first_of_steps([2, 3, 5, 6]), callbacks=[NaNGuard(max_consecutive=3)])
    trainer.fit()
    assert trainer.state.status == "completed" and trainer.state.skipped_steps == 4


def test_with_fp16_loss_scaling_the_guard_shares_amp_scaler(tmp_path):
    seen = {}

    class Probe(Callback):
        order = 5

        def on_fit_begin(self, trainer):
            seen["scaler"] = trainer.grad_scaler

    amp, guard = AMP(loss_scaling=True), NaNGuard()
    trainer = make_trainer(tmp_path, bad=first_of_steps([4]), callbacks=[guard, amp, Probe()])
    trainer.fit()
    assert seen["scaler"] is amp.scaler and guard.scaler is amp.scaler
    assert trainer.state.skipped_steps == 1 and amp.skipped_steps == 1  # counted once
    assert trainer.state.log_history[-1]["amp_skipped_steps"] == 1
    assert trainer.state.log_history[-1]["loss_scale"] == 2.0 ** 14  # the nan step also backed the scale off


def test_host_syncs_per_step(tmp_path):
    """One sync per step: paddle's optimizer reads found_inf on the host; none more with AMP fp16."""
    for name, cbs, optim in [("adamw", [NaNGuard()], "adamw"), ("sgd", [NaNGuard()], "sgd"),
                             ("amp", [AMP(loss_scaling=True), NaNGuard()], "adamw")]:
        counter = CountSyncs()
        trainer = make_trainer(tmp_path / name, callbacks=[counter, *cbs], optim=optim, max_steps=10, logging_steps=5)
        with counter.installed():
            trainer.fit()
        assert counter.per_step == [1] * 8, name
        assert all("paddle/optimizer/optimizer.py" in where for _, where in counter.sources), name


def test_options_are_checked():
    with pytest.raises(ConfigError, match="max_consecutive=0"):
        NaNGuard(max_consecutive=0)
    with pytest.raises(ConfigError, match="max_consecutive=2.5"):
        NaNGuard(max_consecutive=2.5)


def test_check_gradients_false_checks_the_loss_only(tmp_path):
    guard = NaNGuard(check_gradients=False)
    trainer = make_trainer(tmp_path, bad=first_of_steps([2]), callbacks=[guard])
    trainer.fit()
    assert isinstance(guard.scaler, DynamicLossScaler) and not guard.scaler.check_gradients
    assert trainer.state.skipped_steps == 1
