"""AMP and its loss scaler in real Trainer runs on this CPU.

Paddle runs neither auto_cast nor loss scaling on a CPU, so the float16 branch
is driven through the seam ``AMP(loss_scaling=True)``: the real scaler scales
float32 losses. Scaling by powers of two is exact in float32, so a run with
the scaler must follow the float32 run bit for bit, with or without gradient
accumulation and clipping; that is the strongest check that the loss is
scaled before backward and the gradients unscaled once, before clipping.
"""

import doctest
import json
import logging
import os

import numpy as np
import paddle
import pytest
from helpers import ToyDataset, make_mlp, params_of
from host_syncs import CountSyncs

import callbacks.amp
import callbacks.loss_scaler
from callbacks import AMP, Callback, default_callbacks
from callbacks.loss_scaler import DynamicLossScaler
from trainer import Trainer, TrainingArguments
from trainer.errors import ConfigError


def make_trainer(tmp_path, callbacks=(), **overrides):
    values = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, learning_rate=0.01, max_steps=12,
                  logging_steps=4, report_to=[], evaluation_strategy="no", save_strategy="no")
    values.update(overrides)
    return Trainer(make_mlp(), TrainingArguments(**values), train_dataset=ToyDataset(96),
                   loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=list(callbacks))


def opt_state(trainer) -> dict:
    """The optimizer's tensors (moments, beta powers) keyed by structured parameter names."""
    names = sorted(((p.name, n) for n, p in trainer.model.named_parameters()), key=lambda x: -len(x[0]))
    out = {}
    for key, value in trainer.optimizer.state_dict().items():
        if isinstance(value, paddle.Tensor):
            raw, name = next(((r, n) for r, n in names if key.startswith(r + "_")), (key, key))
            out[name + key[len(raw):]] = value.numpy().copy()
    return out


class InjectInf(Callback):
    """Puts +inf into the first gradient after the last backward of the given steps (1-based)."""

    order = 50

    def __init__(self, steps):
        self.steps = set(steps)

    def on_backward_end(self, trainer):
        s = trainer.state
        if s.global_step + 1 in self.steps and s.micro_step == s.num_micro_batches - 1:
            g = next(p for p in trainer.model.parameters() if p.grad is not None).grad
            with paddle.no_grad():
                paddle.assign(paddle.full_like(g, float("inf")), output=g)


class Snapshots(Callback):
    """Parameters and optimizer state before and after every step; the scale after each update."""

    order = 60

    def __init__(self):
        self.before, self.after, self.scales = [], [], []

    def on_step_begin(self, trainer):
        self.before.append((params_of(trainer.model), opt_state(trainer)))

    def on_optimizer_step_end(self, trainer):
        self.after.append((params_of(trainer.model), opt_state(trainer)))
        if trainer.grad_scaler is not None:
            self.scales.append(trainer.grad_scaler.get_loss_scaling())


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_docstrings_run():
    for module in (callbacks.amp, callbacks.loss_scaler):
        assert doctest.testmod(module).failed == 0


@pytest.mark.parametrize("amp,level", [("bf16", "O1"), ("fp16", "O1"), ("fp16", "O2")])
def test_switched_on_from_arguments_trains_and_says_once_it_is_a_no_op_here(tmp_path, caplog, amp, level):
    trainer = make_trainer(tmp_path, amp=amp, amp_level=level, max_steps=40, logging_steps=10, learning_rate=0.05)
    cb = trainer.callbacks.get(AMP)
    assert (cb.dtype, cb.level) == ({"fp16": "float16", "bf16": "bfloat16"}[amp], level)
    with caplog.at_level(logging.WARNING, logger="callbacks.amp"):
        trainer.fit()
        trainer.evaluate(ToyDataset(32, seed=1))
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert losses[-1] < 0.8 * losses[0]
    notes = [r for r in caplog.records if r.name == "callbacks.amp"]
    assert len(notes) == 1 and "no-op on cpu" in notes[0].getMessage()
    assert trainer.grad_scaler is None  # paddle would disable float16 loss scaling on a CPU; so do we
    assert "loss_scale" not in trainer.state.log_history[-1]


def test_auto_cast_path_runs_when_the_device_seam_says_amp_runs(tmp_path):
    """The same paddle calls a GPU run makes (auto_cast, O2 decorate); on a CPU paddle turns them into no-ops."""

    class AMPHere(AMP):
        def amp_runs_on_device(self):
            return True

    entered = []

    class Probe(Callback):
        def on_step_begin(self, trainer):
            entered.append(trainer.callbacks.forward_context(trainer))

    amp = AMPHere(dtype="bfloat16", level="O2")
    trainer = make_trainer(tmp_path, callbacks=[amp, Probe()], max_steps=6)
    trainer.fit()
    assert trainer.state.status == "completed"
    assert trainer.grad_scaler is None  # bfloat16 needs no loss scaling
    assert len(entered) == 6 and all(ctx is not None for ctx in entered)
    assert amp.forward_context(trainer) is not None
    assert AMP(dtype="bfloat16").forward_context(trainer) is None  # on this CPU: no context at all


@pytest.mark.parametrize("accumulation", [1, 3])
def test_loss_scaling_follows_the_float32_run_bit_for_bit_with_clipping(tmp_path, accumulation):
    common = dict(gradient_accumulation_steps=accumulation, max_grad_norm=0.05, max_steps=9, logging_steps=3)
    plain = make_trainer(tmp_path / "plain", **common)
    plain.fit()
    amp = AMP(loss_scaling=True, incr_every_n_steps=2)
    scaled = make_trainer(tmp_path / "amp", callbacks=[amp], **common)
    scaled.fit()
    assert same(params_of(plain.model), params_of(scaled.model))
    assert same(opt_state(plain), opt_state(scaled))
    for a, b in zip(plain.state.log_history, scaled.state.log_history):
        assert a["grad_norm"] == b["grad_norm"]  # clipping saw true gradients
        assert a["loss"] == b["loss"]
    # the scale grew every 2 finite steps: 2^15 -> 2^16 after step 2, ... -> 2^19 after step 8
    assert [r["loss_scale"] for r in scaled.state.log_history] == [2.0 ** 16, 2.0 ** 18, 2.0 ** 19]
    assert [r["amp_skipped_steps"] for r in scaled.state.log_history] == [0, 0, 0]


def test_loss_is_scaled_before_backward_and_gradients_unscaled_before_clipping(tmp_path):
    seen = {}

    class Before(Callback):
        order = -1

        def on_backward_begin(self, trainer):
            seen.setdefault("loss", float(trainer.state.loss))

    class After(Callback):
        order = 5

        def on_backward_begin(self, trainer):
            seen.setdefault("scaled_loss", float(trainer.state.loss))

        def on_backward_end(self, trainer):
            seen.setdefault("scaled_grad", trainer.model[0].weight.grad.numpy().copy())

        def on_optimizer_step_begin(self, trainer):  # the trainer clips right after this event
            seen.setdefault("grad", trainer.model[0].weight.grad.numpy().copy())

    trainer = make_trainer(tmp_path, callbacks=[AMP(init_loss_scaling=1024.0, loss_scaling=True), Before(), After()],
                           max_steps=1, max_grad_norm=1.0)
    trainer.fit()
    assert seen["scaled_loss"] == pytest.approx(1024.0 * seen["loss"], rel=1e-6)
    np.testing.assert_allclose(seen["scaled_grad"], 1024.0 * seen["grad"], rtol=1e-6)


def test_a_non_finite_step_is_skipped_counted_and_backs_the_scale_off(tmp_path):
    snaps = Snapshots()
    amp = AMP(loss_scaling=True, incr_every_n_steps=3)
    trainer = make_trainer(tmp_path, callbacks=[amp, InjectInf([4, 5]), snaps], max_steps=10, logging_steps=5)
    trainer.fit()
    for step in (4, 5):  # parameters and AdamW moments untouched by the skipped updates
        (p0, o0), (p1, o1) = snaps.before[step - 1], snaps.after[step - 1]
        assert same(p0, p1) and same(o0, o1)
    for step in (3, 6):  # the others train
        assert not same(snaps.before[step - 1][0], snaps.after[step - 1][0])
    s = 2.0 ** 15
    # grow after 3 finite steps; halve on each overflow (and the finite count restarts)
    assert snaps.scales == [s, s, 2 * s, s, s / 2, s / 2, s / 2, s, s, s]
    assert [r["amp_skipped_steps"] for r in trainer.state.log_history] == [2, 2]
    assert trainer.state.skipped_steps == 2 and amp.skipped_steps == 2
    assert trainer.state.global_step == 10  # skipped steps still count as steps
    assert all(np.isfinite(v).all() for v in params_of(trainer.model).values())


def test_scaler_state_round_trips_through_a_checkpoint(tmp_path):
    first = make_trainer(tmp_path, callbacks=[AMP(loss_scaling=True, incr_every_n_steps=2), InjectInf([3])],
                         max_steps=7)
    first.fit()
    path = first.save_checkpoint(str(tmp_path / "ckpt"))
    getattr(first, "wait_for_checkpoint", lambda: None)()  # saves may be written in the background
    with open(os.path.join(path, "trainer.json"), encoding="utf-8") as f:
        saved = json.load(f)["callbacks"]["AMP"]
    # finite 1,2 -> 2^16; overflow at 3 -> 2^15; finite 4,5 -> 2^16; 6,7 -> 2^17
    assert saved["scaler"]["scale"] == 2.0 ** 17 and saved["skipped_steps"] == 1
    assert saved["scaler"]["incr_count"] == 0 and saved["scaler"]["decr_count"] == 0

    seen = {}

    class Probe(Callback):
        order = 5

        def on_fit_begin(self, trainer):
            seen["state"] = trainer.grad_scaler.state_dict()
            seen["skipped"] = trainer.state.skipped_steps

    amp = AMP(loss_scaling=True, incr_every_n_steps=2)
    second = make_trainer(tmp_path, callbacks=[amp, Probe()], max_steps=9)
    second.fit(resume_from_checkpoint=path)
    assert seen["state"] == saved["scaler"] and seen["skipped"] == 1
    assert amp.state_dict()["scaler"]["scale"] == 2.0 ** 18  # two more finite steps
    assert amp.state_dict()["skipped_steps"] == 1


def test_a_step_skipped_on_a_host_flag_leaves_the_scaler_ready(tmp_path):
    class SkipThird(Callback):
        order = 50

        def on_optimizer_step_begin(self, trainer):
            if trainer.state.global_step + 1 == 3:
                trainer.state.skip_optimizer_step = True

    trainer = make_trainer(tmp_path, callbacks=[AMP(loss_scaling=True), SkipThird()], max_steps=5)
    trainer.fit()
    assert trainer.state.status == "completed" and trainer.state.skipped_steps == 1


def test_host_syncs_per_step(tmp_path):
    """No sync per step without loss scaling; exactly one with it: paddle's optimizer reading found_inf."""
    results = {}
    for name, cbs in {"plain": [], "bf16": [AMP(dtype="bfloat16")], "fp16": [AMP(loss_scaling=True)]}.items():
        counter = CountSyncs()
        trainer = make_trainer(tmp_path / name, callbacks=[counter, *cbs], max_steps=12, logging_steps=4,
                               max_grad_norm=1.0, gradient_accumulation_steps=2)
        with counter.installed():
            trainer.fit()
        assert len(counter.per_step) == 9  # 12 steps, 3 of them log
        results[name] = (counter.per_step, counter.sources)
    assert results["plain"][0] == [0] * 9
    assert results["bf16"][0] == [0] * 9
    assert results["fp16"][0] == [1] * 9
    assert all("paddle/optimizer/optimizer.py" in where for _, where in results["fp16"][1])


def test_bad_options_and_defaults():
    with pytest.raises(ConfigError, match="dtype='fp8'"):
        AMP(dtype="fp8")
    with pytest.raises(ConfigError, match="level='O3'"):
        AMP(level="O3")
    with pytest.raises(ConfigError, match="init_loss_scaling"):
        AMP(init_loss_scaling=0)
    assert not any(isinstance(cb, AMP) for cb in default_callbacks(TrainingArguments(report_to=[])))
    (amp,) = [cb for cb in default_callbacks(TrainingArguments(amp="bf16", amp_level="O2", report_to=[]))
              if isinstance(cb, AMP)]
    assert (amp.dtype, amp.level, amp.loss_scaling) == ("bfloat16", "O2", None)


def test_scaler_refuses_out_of_order_calls():
    model = make_mlp()
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler = DynamicLossScaler(parameters=model.parameters())
    scaler.scale(model(paddle.ones([2, 8])).sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="follow step"):
        scaler.update()
    scaler.step(opt)
    scaler.update()
    assert scaler.stage == "ready" and scaler.take_skipped() == 0


def test_fused_and_per_gradient_unscaling_agree(monkeypatch):
    """paddle's fused kernel (float32 here) and the per-gradient path (float16 on a CPU, or no kernel)."""
    rng = np.random.RandomState(0)
    values = [rng.randn(5, 3).astype("float32"), rng.randn(7).astype("float32")]
    scale = paddle.full([], 1024.0, dtype="float32")

    def run(dtype, inf):
        grads = [paddle.to_tensor(v * 1024.0).astype(dtype) for v in values]
        if inf:
            grads[1][2] = float("inf")
        found = callbacks.loss_scaler.unscale_and_check(grads, scale)
        return bool(found), [g.astype("float32").numpy() for g in grads]

    fused_found, fused = run("float32", False)
    half_found, half = run("float16", False)  # no float16 kernel on a CPU: per gradient
    monkeypatch.setattr(callbacks.loss_scaler, "FUSED_UNSCALE", None)
    each_found, each = run("float32", False)
    assert not (fused_found or half_found or each_found)
    for a, b, c, v in zip(fused, each, half, values):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(c, v, rtol=1e-3, atol=1e-3)
    assert run("float32", True)[0] and run("float16", True)[0]
    monkeypatch.undo()
    assert run("float32", True)[0]


def test_per_gradient_path_follows_the_float32_run_and_skips_overflow(tmp_path, monkeypatch):
    monkeypatch.setattr(callbacks.loss_scaler, "FUSED_UNSCALE", None)
    plain = make_trainer(tmp_path / "plain", max_grad_norm=0.05, max_steps=6)
    plain.fit()
    scaled = make_trainer(tmp_path / "amp", callbacks=[AMP(loss_scaling=True)], max_grad_norm=0.05, max_steps=6)
    scaled.fit()
    assert same(params_of(plain.model), params_of(scaled.model))
    snaps = Snapshots()
    overflow = make_trainer(tmp_path / "inf", callbacks=[AMP(loss_scaling=True), InjectInf([3]), snaps], max_steps=6)
    overflow.fit()
    assert same(snaps.before[2][0], snaps.after[2][0]) and same(snaps.before[2][1], snaps.after[2][1])
    assert overflow.state.skipped_steps == 1
