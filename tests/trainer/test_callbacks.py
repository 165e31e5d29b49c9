"""Events, callback order, control flags, error naming, describe_callbacks."""

import contextlib

import numpy as np
import paddle
import pytest
from helpers import ToyDataset, make_mlp, params_of

from callbacks import Callback, CallbackList
from trainer import CallbackError, ConfigError, Event, Trainer, TrainingArguments


def make_trainer(tmp_path, callbacks=(), **overrides):
    values = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, num_train_epochs=2,
                  report_to=[], save_strategy="no", evaluation_strategy="no")
    values.update(overrides)
    return Trainer(make_mlp(), TrainingArguments(**values), train_dataset=ToyDataset(32), eval_dataset=ToyDataset(12),
                   loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=list(callbacks))


class Recorder(Callback):
    def __init__(self, name, log, order=50):
        self.name, self.log, self.order = name, log, order

    @property
    def state_key(self):
        return f"Recorder-{self.name}"

    def on_step_end(self, trainer):
        self.log.append((self.name, "step_end"))

    def on_fit_begin(self, trainer):
        self.log.append((self.name, "fit_begin"))


def test_order_attribute_then_insertion_order(tmp_path):
    log = []
    cbs = [Recorder("late", log, order=60), Recorder("a", log, order=10), Recorder("b", log, order=10)]
    make_trainer(tmp_path, cbs, max_steps=1).fit()
    assert log == [("a", "fit_begin"), ("b", "fit_begin"), ("late", "fit_begin"),
                   ("a", "step_end"), ("b", "step_end"), ("late", "step_end")]


def test_event_sequence_of_a_step_with_accumulation(tmp_path):
    seen = []

    class All(Callback):
        pass

    for event in Event:
        setattr(All, event.method, (lambda e: lambda self, trainer: seen.append(e.value))(event))
    make_trainer(tmp_path, [All()], max_steps=1, gradient_accumulation_steps=2).fit()
    assert seen == ["fit_begin", "epoch_begin", "step_begin", "backward_begin", "backward_end", "backward_begin",
                    "backward_end", "optimizer_step_begin", "optimizer_step_end", "step_end", "log", "fit_end"]


def test_callback_can_stop_training(tmp_path):
    class StopAt3(Callback):
        def on_step_end(self, trainer):
            if trainer.state.global_step == 3:
                trainer.state.should_stop = True

    state = make_trainer(tmp_path, [StopAt3()]).fit()
    assert state.global_step == 3 and state.status == "stopped"


def test_callback_can_skip_an_optimizer_step(tmp_path):
    class SkipAll(Callback):
        def on_optimizer_step_begin(self, trainer):
            trainer.state.skip_optimizer_step = True

    trainer = make_trainer(tmp_path, [SkipAll()], max_steps=3)
    before = params_of(trainer.model)
    state = trainer.fit()
    after = params_of(trainer.model)
    assert state.skipped_steps == 3 and state.global_step == 3
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0 for p in trainer.model.parameters())


def test_callback_can_ask_for_evaluation_and_save(tmp_path):
    class Ask(Callback):
        def on_step_end(self, trainer):
            if trainer.state.global_step == 2:
                trainer.state.should_evaluate = True
                trainer.state.should_save = True

    trainer = make_trainer(tmp_path, [Ask()], max_steps=3)
    trainer.fit()
    assert (tmp_path / "checkpoints" / "step-2" / "manifest.json").is_file()
    assert any("eval_loss" in r and r["step"] == 2 for r in trainer.state.log_history)


def test_forward_context_and_loss_replacement(tmp_path):
    entered = []

    class Ctx(Callback):
        def forward_context(self, trainer):
            @contextlib.contextmanager
            def ctx():
                entered.append(paddle.is_grad_enabled())
                yield
            return ctx()

    class ZeroLoss(Callback):
        def on_backward_begin(self, trainer):
            trainer.state.loss = trainer.state.loss * 0.0

    trainer = make_trainer(tmp_path, [Ctx(), ZeroLoss()], max_steps=2)
    before = params_of(trainer.model)
    trainer.fit()
    assert entered == [True, True]
    for k, v in params_of(trainer.model).items():  # zero gradients: AdamW moves nothing but decay (0 here)
        np.testing.assert_allclose(v, before[k], atol=1e-7)


def test_error_in_callback_names_callback_and_event(tmp_path):
    class Broken(Callback):
        def on_optimizer_step_end(self, trainer):
            raise KeyError("boom")

    ended = []

    class Watch(Callback):
        def on_exception(self, trainer):
            ended.append(("exception", type(trainer.state.error).__name__))

        def on_fit_end(self, trainer):
            ended.append(("fit_end", trainer.state.status))

    trainer = make_trainer(tmp_path, [Broken(), Watch()])
    with pytest.raises(CallbackError) as info:
        trainer.fit()
    assert str(info.value) == "callback Broken failed in on_optimizer_step_end: KeyError: 'boom'"
    assert isinstance(info.value.__cause__, KeyError)
    assert ended == [("exception", "CallbackError"), ("fit_end", "failed")]


def test_error_in_user_code_passes_through_and_cleanup_errors_do_not_mask_it(tmp_path):
    class BadCleanup(Callback):
        def on_fit_end(self, trainer):
            raise RuntimeError("cleanup failed")

    class Bad(Trainer):
        def compute_loss(self, model, batch):
            raise ValueError("user bug")

    t = Bad(make_mlp(), TrainingArguments(output_dir=str(tmp_path), report_to=[], save_strategy="no"),
            train_dataset=ToyDataset(16), callbacks=[BadCleanup()])
    with pytest.raises(ValueError, match="user bug"):
        t.fit()


def test_describe_callbacks_lists_events_in_run_order(tmp_path):
    log = []
    trainer = make_trainer(tmp_path, [Recorder("x", log, order=1)], report_to=["jsonl"])
    text = trainer.describe_callbacks()
    assert "on_step_end" in text
    line = next(l for l in text.splitlines() if l.strip().startswith("on_step_end"))
    names = line.split()[1::2]
    assert names[0] == "Recorder" and names.index("FlowControl") < names.index("Rank0Logger")
    orders = {type(cb).__name__: cb.order for cb in trainer.callbacks}
    assert [orders[n] for n in names] == sorted(orders[n] for n in names)


def test_unused_events_are_not_dispatched():
    class OnlyLog(Callback):
        def on_log(self, trainer):
            pass

    cl = CallbackList([OnlyLog()])
    assert cl.has_handlers(Event.LOG) and not cl.has_handlers(Event.STEP_END)


def test_bad_callbacks_are_rejected():
    with pytest.raises(ConfigError, match="was given as a class"):
        CallbackList([Callback])
    with pytest.raises(ConfigError, match="is not a callbacks.Callback"):
        CallbackList([object()])
    with pytest.raises(ConfigError, match="share the state_key"):
        CallbackList([Callback(), Callback()])


def test_non_scalar_and_non_tensor_loss_are_clear_errors(tmp_path):
    from trainer import TrainingError

    class Vector(Trainer):
        def compute_loss(self, model, batch):
            return model(batch[0]).sum(axis=1)

    class Number(Trainer):
        def compute_loss(self, model, batch):
            return 1.0

    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], save_strategy="no")
    with pytest.raises(TrainingError, match=r"compute_loss returned a tensor of shape \[8\], not a scalar"):
        Vector(make_mlp(), args, train_dataset=ToyDataset(16)).fit()
    with pytest.raises(TrainingError, match="compute_loss returned float, not a paddle.Tensor"):
        Number(make_mlp(), args, train_dataset=ToyDataset(16)).fit()


def test_callback_state_round_trips_through_a_checkpoint(tmp_path):
    class Counter(Callback):
        def __init__(self):
            self.n = 0

        def on_step_end(self, trainer):
            self.n += 1

        def state_dict(self):
            return {"n": self.n}

        def load_state_dict(self, state):
            self.n = state["n"]

    c = Counter()
    trainer = make_trainer(tmp_path, [c], max_steps=3, save_strategy="steps", save_steps=3)
    trainer.fit()
    fresh = Counter()
    t2 = make_trainer(tmp_path, [fresh], max_steps=5)
    t2.fit(resume_from_checkpoint="auto")
    assert fresh.n == 5 and t2.state.global_step == 5
