"""The default callback set catches non-finite gradients and parameters (NaNGuard action='stop'): a nan
feature hidden by a ReLU stops the run at the next logging step naming the step, with exit code 5 and no
host sync on the steps that do not log."""

import os

import numpy as np
import paddle
import pytest
from helpers import ToyDataset, make_mlp
from host_syncs import CountSyncs

from callbacks import Callback, LossSpikeRecovery, NaNGuard
from trainer import Trainer, TrainingArguments
from trainer.data import ResumableDistributedBatchSampler
from trainer.errors import TrainingError

BATCH, N = 8, 96


def index_in_step(step):
    sampler = ResumableDistributedBatchSampler(N, BATCH, shuffle=True, seed=0)
    sampler.set_epoch(0)
    return list(iter(sampler))[step - 1][0]


class OneNaNFeature(ToyDataset):
    def __init__(self, bad_index=None):
        super().__init__(N)
        if bad_index is not None:
            self.x[bad_index, 3] = np.nan


def make(tmp_path, bad_step=None, callbacks=(), **overrides):
    values = dict(output_dir=str(tmp_path), per_device_train_batch_size=BATCH, learning_rate=0.01, max_steps=10,
                  logging_steps=5, report_to=[], evaluation_strategy="no", save_strategy="no")
    values.update(overrides)
    data = OneNaNFeature(index_in_step(bad_step) if bad_step else None)
    return Trainer(make_mlp(), TrainingArguments(**values), train_dataset=data, loss_fn=paddle.nn.CrossEntropyLoss(),
                   callbacks=list(callbacks))


def fit_and_fail(t, loss_hides_it=True):
    losses = []

    class Losses(Callback):
        def on_log(self, trainer):
            losses.append(trainer.state.logs.get("loss"))

    t.add_callback(Losses())
    with pytest.raises(TrainingError) as err:
        t.fit()
    message = str(err.value)
    assert err.value.exit_code == 5 and "\n" not in message
    assert t.state.status == "failed" and t.state.global_step == 5
    if loss_hides_it:  # without clipping the logged loss alone would never have shown it
        assert np.isfinite(losses).all()
    return message


@pytest.mark.parametrize("how", ["clip norm", "own pass"])
def test_nan_feature_behind_relu_stops_at_the_next_logging_step_naming_the_step(tmp_path, how):
    # the default guard rides on the clip norm; NaNGuard(action='stop') runs its own pass over the gradients
    if how == "clip norm":
        t = make(tmp_path, bad_step=4, max_grad_norm=1.0)
        assert not any(isinstance(cb, NaNGuard) and cb.check_gradients for cb in t.callbacks)
    else:
        t = make(tmp_path, bad_step=4, callbacks=[NaNGuard(action="stop")])
    message = fit_and_fail(t, loss_hides_it=how == "own pass")  # a nan norm scales every gradient to nan
    assert message.startswith("NaNGuard: the gradients of step 4 hold nan or inf, and the parameters are no longer "
                              "finite (checked at logging step 5); training stopped: check the data of step 4"), message


def test_without_clipping_the_default_names_the_steps_since_the_last_check(tmp_path):
    message = fit_and_fail(make(tmp_path, bad_step=4))
    assert message.startswith("NaNGuard: the parameters hold nan or inf at step 5 (checked at logging step 5; they "
                              "were finite at step 0: an update of steps 1-5 made them so"), message


def test_a_non_finite_loss_is_named_by_its_step(tmp_path):
    calls = []

    def loss_fn(logits, labels):
        calls.append(1)
        loss = paddle.nn.functional.cross_entropy(logits, labels)
        return loss * float("nan") if len(calls) == 7 else loss  # the loss of step 7

    t = make(tmp_path)
    t.loss_fn = loss_fn
    with pytest.raises(TrainingError, match=r"^NaNGuard: the loss of step 7 is not finite, and the parameters are no "
                                            r"longer finite \(checked at logging step 10\)"):
        t.fit()


def test_nan_weights_are_never_saved(tmp_path):
    t = make(tmp_path, bad_step=2, save_strategy="steps", save_steps=3, max_grad_norm=1.0)
    with pytest.raises(TrainingError, match=r"the gradients of step 2 .*checked before saving step 3"):
        t.fit()
    assert not os.path.isdir(tmp_path / "checkpoints" / "step-3")


def test_non_finite_parameters_with_finite_gradients_are_caught(tmp_path):
    class Corrupt(Callback):
        def on_optimizer_step_end(self, trainer):
            if trainer.state.global_step == 10:  # after the update of the logging step: its gradients were finite
                with paddle.no_grad():
                    w = trainer.model[2].bias
                    paddle.assign(paddle.full_like(w, float("inf")), output=w)

    t = make(tmp_path, callbacks=[Corrupt()], max_steps=12)
    with pytest.raises(TrainingError, match=r"the parameters hold nan or inf at step 10 \(checked at logging step 10; "
                                                  r"they were finite at step 5: .*check the data of steps 6-10 "):
        t.fit()


@pytest.mark.parametrize("clip", [None, 1.0])
def test_a_clean_run_completes_and_costs_no_host_sync_per_step(tmp_path, clip):
    counter = CountSyncs()
    t = make(tmp_path, callbacks=[counter], max_grad_norm=clip)
    assert any(isinstance(cb, NaNGuard) and cb.action == "stop" for cb in t.callbacks)
    with counter.installed():
        state = t.fit()
    assert state.status == "completed"
    assert counter.per_step == [0] * 8, counter.sources


def test_a_users_nan_guard_replaces_the_default_and_skips(tmp_path):
    t = make(tmp_path, bad_step=4, callbacks=[NaNGuard()])
    guards = [cb for cb in t.callbacks if isinstance(cb, NaNGuard)]
    assert len(guards) == 1 and guards[0].action == "skip"
    state = t.fit()
    assert state.status == "completed" and state.skipped_steps == 1


def test_loss_spike_recovery_takes_over_non_finite_windows():
    args = TrainingArguments(output_dir="unused", report_to=[])
    t = Trainer(make_mlp(), args, train_dataset=ToyDataset(16), callbacks=[LossSpikeRecovery()])
    assert not any(isinstance(cb, NaNGuard) for cb in t.callbacks)


def test_ptrain_exits_5_naming_the_step(tmp_path):
    import subprocess
    import sys

    from helpers import REPO

    proc = subprocess.run([sys.executable, "-m", "trainer.cli", "run", "digits", "--max_steps", "30", "--learning_rate",
                           "1e20", "--optim", "sgd", "--output_dir", str(tmp_path), "--report_to", "jsonl",
                           "--logging_steps", "10", "--evaluation_strategy", "no"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 5, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(("ptrain: error: NaNGuard: the gradients of step ", "ptrain: error: NaNGuard: the loss of step "))
    assert "(checked at logging step 10)" in last, last
    assert not os.path.isdir(tmp_path / "checkpoints")


def test_two_processes_stop_together_at_the_same_step(tmp_path):
    import json

    from helpers import REPO, launch

    out = str(tmp_path / "out")
    os.makedirs(out)
    launch(os.path.join(REPO, "tests", "distributed", "workers", "nan_toy.py"), [out], 2, str(tmp_path / "logs"))
    results = []
    for rank in (0, 1):
        with open(os.path.join(out, f"nan-rank{rank}.json")) as f:
            results.append(json.load(f))
    assert results[0] == results[1], results
    assert results[0]["step"] == 5
    assert results[0]["message"].startswith("NaNGuard: the gradients of step 4 hold nan or inf")


@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("when", ["log", "save"])
def test_a_nan_loss_with_finite_gradients_stops_every_rank_count_alike(tmp_path, nproc, when):
    """Issue 32: on 2 processes a nan loss with finite gradients was logged ("loss=nan" at step 10), 14
    checkpoints were written and the run exited 0; on 1 process it stopped with exit 5."""
    import json

    from helpers import REPO, launch

    out = str(tmp_path / "out")
    os.makedirs(out)
    launch(os.path.join(REPO, "tests", "distributed", "workers", "nan_toy.py"), [out, f"loss-{when}"], nproc,
           str(tmp_path / "logs"))
    results = []
    for rank in range(nproc):
        with open(os.path.join(out, f"nan-rank{rank}.json")) as f:
            results.append(json.load(f))
    step, check = (10, "checked at logging step 10") if when == "log" else (8, "checked before saving step 8")
    for rank, result in enumerate(results):
        assert result["code"] == 5 and result["step"] == step and result["params_finite"], (rank, result)
        assert result["message"].startswith("NaNGuard: ") and check in result["message"], (rank, result)
    assert results[-1]["message"].startswith("NaNGuard: the loss of step 7 is not finite (")  # the rank whose loss
    if nproc == 2:
        assert results[0]["message"].startswith("NaNGuard: the loss is not finite on a rank in steps 6-")
    assert not os.path.isdir(os.path.join(out, "checkpoints", "step-8"))  # never saved


def test_with_logging_off_the_kept_steps_are_folded_on_the_device_and_the_save_check_names_the_step(tmp_path):
    from callbacks.nan_guard import KEEP_MAX

    calls, sizes = [], []

    def loss_fn(logits, labels):
        calls.append(1)
        loss = paddle.nn.functional.cross_entropy(logits, labels)
        return loss * float("inf") if len(calls) == 100 else loss  # step 100: among the folded steps

    class Kept(Callback):
        order = 99  # after NaNGuard's on_optimizer_step_end

        def on_optimizer_step_end(self, trainer):
            sizes.append(len(next(cb for cb in trainer.callbacks if isinstance(cb, NaNGuard))._kept))

    counter = CountSyncs()
    t = make(tmp_path, callbacks=[Kept(), counter], max_steps=KEEP_MAX + 100, logging_strategy="no",
             save_strategy="steps", save_steps=KEEP_MAX + 100, flush_at_end=False)
    t.loss_fn = loss_fn
    with counter.installed(), pytest.raises(TrainingError, match=rf"^NaNGuard: the loss of step 100 is not "
                                                                 rf"finite.*\(checked before saving step {KEEP_MAX + 100}\)"):
        t.fit()
    assert max(sizes) == KEEP_MAX - 1 and sizes[KEEP_MAX - 1] == 0  # bounded: folded at KEEP_MAX
    assert not os.path.isdir(tmp_path / "checkpoints" / f"step-{KEEP_MAX + 100}")
    assert set(counter.per_step) == {0}, counter.sources  # the fold reads nothing on the host
