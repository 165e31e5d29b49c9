"""PaddleNLP's own callback event-flow cases (tests/trainer/test_trainer_callback.py
in PaddleNLP), rewritten for this project: a recording PaddleNLP
``TrainerCallback`` must see the same hook calls, in the same order, under
PaddleNLP's Trainer and under ours, for every case, and both must match the
expected sequence PaddleNLP's test derives from the arguments. Also: adding,
popping and removing PaddleNLP callbacks by class or instance, control flags
honoured, and hooks named in errors.
"""

import os
import sys

import numpy as np
import paddle
import pytest

pytest.importorskip("paddlenlp")

from paddlenlp.trainer import IntervalStrategy, PrinterCallback, TrainerCallback  # noqa: E402
from paddlenlp.trainer import Trainer as PaddleNLPTrainer  # noqa: E402
from paddlenlp.trainer import TrainingArguments as PaddleNLPArguments  # noqa: E402

from trainer import CallbackError, Trainer  # noqa: E402

HOOKS = ("on_init_end", "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_step_begin",
         "on_step_end", "on_evaluate", "on_save", "on_log", "on_prediction_step")
EXTRA_HOOKS = ("on_substep_end", "on_optimizer_begin", "on_optimizer_end")


class Recorder(TrainerCallback):
    """Registers the events that go through (PaddleNLP's MyTestTrainerCallback)."""

    def __init__(self, hooks=HOOKS):
        self.events = []
        for hook in hooks:
            setattr(self, hook, self._make(hook))

    def _make(self, hook):
        def record(args, state, control, **kwargs):
            self.events.append(hook)
        return record


class RegressionDataset(paddle.io.Dataset):
    def __init__(self, length=64, seed=42):
        rng = np.random.RandomState(seed)
        self.x = rng.normal(size=(length,)).astype("float32")
        self.y = (2.0 * self.x + 3.0 + rng.normal(scale=0.1, size=(length,))).astype("float32")

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_x": self.x[i], "labels": self.y[i]}


class RegressionModel(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.a = self.create_parameter([1], default_initializer=paddle.nn.initializer.Constant(0.0))
        self.b = self.create_parameter([1], default_initializer=paddle.nn.initializer.Constant(0.0))

    def forward(self, input_x, labels=None):
        y = input_x * self.a + self.b
        return y if labels is None else (paddle.nn.functional.mse_loss(y, labels), y)


def make(trainer_cls, out, callbacks, **kwargs):
    args = PaddleNLPArguments(str(out), disable_tqdm=True, report_to=[], device="cpu", **kwargs)
    return trainer_cls(model=RegressionModel(), args=args, train_dataset=RegressionDataset(),
                       eval_dataset=RegressionDataset(), callbacks=callbacks)


def expected_events(args, num_train_epochs, train_batches, eval_batches):
    """PaddleNLP's get_expected_events, from the arguments alone."""
    events, step = ["on_init_end", "on_train_begin"], 0
    evaluation = ["on_prediction_step"] * eval_batches + ["on_log", "on_evaluate"]
    for _ in range(num_train_epochs):
        events.append("on_epoch_begin")
        for _ in range(train_batches):
            step += 1
            events += ["on_step_begin", "on_step_end"]
            if step % args.logging_steps == 0:
                events.append("on_log")
            if args.evaluation_strategy == IntervalStrategy.STEPS and step % args.eval_steps == 0:
                events += evaluation
            if step % args.save_steps == 0:
                events.append("on_save")
        events.append("on_epoch_end")
        if args.evaluation_strategy == IntervalStrategy.EPOCH:
            events += evaluation
    return events + ["on_log", "on_train_end"]


CASES = {
    "defaults": {},
    "logging_steps=5": {"logging_steps": 5},
    "save_steps=5": {"save_steps": 5},
    "eval_steps=5": {"eval_steps": 5, "evaluation_strategy": "steps"},
    "evaluation_strategy=epoch": {"evaluation_strategy": "epoch"},
    "a bit of everything": {"logging_steps": 3, "save_steps": 10, "eval_steps": 5, "evaluation_strategy": "steps"},
}


# beyond PaddleNLP's cases (its expected-events rule does not model these): both trainers' streams must agree
MORE_CASES = {
    "logging_strategy=epoch, save_strategy=epoch": {"logging_strategy": "epoch", "save_strategy": "epoch"},
    "logging_first_step, accumulation 2": {"logging_first_step": True, "logging_steps": 3, "gradient_accumulation_steps": 2},
}


@pytest.mark.parametrize("case", list(CASES) + list(MORE_CASES))
def test_event_flow_matches_paddlenlp(case, tmp_path):
    kwargs = dict(num_train_epochs=3, **CASES.get(case, MORE_CASES.get(case)))
    streams = {}
    for name, cls in (("paddlenlp", PaddleNLPTrainer), ("ours", Trainer)):
        recorder = Recorder(HOOKS + EXTRA_HOOKS if case in MORE_CASES else HOOKS)
        trainer = make(cls, tmp_path / name, [recorder], **kwargs)
        trainer.train()
        streams[name] = recorder.events
    if case in MORE_CASES:
        assert streams["ours"] == streams["paddlenlp"]
        return
    args = PaddleNLPArguments(str(tmp_path / "x"), **kwargs)
    expected = expected_events(args, 3, train_batches=8, eval_batches=8)
    assert streams["paddlenlp"] == expected  # the reference: PaddleNLP's own rule on this paddlenlp
    assert streams["ours"] == expected


def test_callback_classes_instances_add_pop_remove(tmp_path):
    recorder = Recorder()
    trainer = make(Trainer, tmp_path, [recorder, PrinterCallback])  # a class is instantiated, as in PaddleNLP
    handler = trainer.pop_callback(PrinterCallback)
    assert isinstance(handler, PrinterCallback)
    assert trainer.pop_callback(PrinterCallback) is None
    trainer.add_callback(PrinterCallback())
    trainer.remove_callback(PrinterCallback)
    assert trainer.pop_callback(recorder) is recorder
    trainer.add_callback(recorder)
    trainer.train()
    assert recorder.events[:2] == ["on_init_end", "on_train_begin"]  # on_init_end once, at construction
    assert recorder.events[-1] == "on_train_end"


class StopAtStep3(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3:
            control.should_training_stop = True
            control.should_save = True
        return control


class EvaluateAtStep2(TrainerCallback):
    def __init__(self):
        self.metrics = None

    def on_step_end(self, args, state, control, **kwargs):
        control.should_evaluate = state.global_step == 2

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.metrics = dict(metrics)


def test_control_flags_are_honoured(tmp_path):
    for cls in (PaddleNLPTrainer, Trainer):
        recorder, evaluator = Recorder(), EvaluateAtStep2()
        trainer = make(cls, tmp_path / cls.__module__, [StopAtStep3(), evaluator, recorder], num_train_epochs=3)
        out = trainer.train()
        assert out.global_step == 3, cls
        assert recorder.events.count("on_save") == 1 and recorder.events.count("on_evaluate") == 1, cls
        assert "eval_loss" in evaluator.metrics
        # PaddleNLP ends the epoch it leaves early; so do we
        assert recorder.events[-4:] == ["on_save", "on_epoch_end", "on_log", "on_train_end"], (cls, recorder.events[-6:])


class Broken(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        raise KeyError("boom")


def test_an_error_names_the_paddlenlp_callback_and_hook(tmp_path):
    trainer = make(Trainer, tmp_path, [Broken()])
    with pytest.raises(CallbackError, match=r"callback Broken failed in on_step_end: KeyError"):
        trainer.train()


def test_state_seen_by_paddlenlp_callbacks(tmp_path):
    seen = []

    class Look(TrainerCallback):
        def on_log(self, args, state, control, logs=None, model=None, optimizer=None, lr_scheduler=None, **kwargs):
            seen.append((state.global_step, state.epoch, len(state.log_history), dict(logs), model is not None,
                         optimizer is not None, lr_scheduler is not None, state.is_world_process_zero))

    trainer = make(Trainer, tmp_path, [Look()], num_train_epochs=1, logging_steps=4)
    trainer.train()
    step, epoch, history, logs, *present = seen[0]
    assert (step, epoch, history) == (4, 0.5, 1) and "loss" in logs and all(present)
    assert seen[-1][3].get("train_loss") is not None  # train()'s summary log


def test_paddlenlp_early_stopping_stops_both_trainers_at_the_same_step(tmp_path):
    from paddlenlp.trainer import EarlyStoppingCallback

    kwargs = dict(num_train_epochs=3, learning_rate=1e-9, evaluation_strategy="steps", eval_steps=4, save_steps=4,
                  load_best_model_at_end=True, metric_for_best_model="loss")
    streams, steps = {}, {}
    for name, cls in (("paddlenlp", PaddleNLPTrainer), ("ours", Trainer)):
        recorder = Recorder()
        stopper = EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=0.01)
        trainer = make(cls, tmp_path / name, [stopper, recorder], **kwargs)
        steps[name] = trainer.train().global_step
        streams[name] = recorder.events
    assert steps["paddlenlp"] == steps["ours"] == 12  # evaluations at 4 (best), 8, 12: no improvement twice
    assert streams["ours"] == streams["paddlenlp"]


class StateRecorder(TrainerCallback):
    """Records (hook, global_step, epoch) at every hook: the state a PaddleNLP callback reads there."""

    def __init__(self):
        self.seen = []
        for hook in HOOKS + EXTRA_HOOKS:
            setattr(self, hook, self._make(hook))

    def _make(self, hook):
        def record(args, state, control, **kwargs):
            self.seen.append((hook, state.global_step, round(float(state.epoch or 0), 4)))
        return record


@pytest.mark.parametrize("kwargs", [{"logging_steps": 5}, {"gradient_accumulation_steps": 2, "logging_steps": 3}])
def test_hook_time_state_matches_paddlenlp(kwargs, tmp_path):
    """global_step and epoch at each hook, on_optimizer_begin/_end included, as under PaddleNLP's Trainer."""
    seen = {}
    for name, cls in (("paddlenlp", PaddleNLPTrainer), ("ours", Trainer)):
        recorder = StateRecorder()
        make(cls, tmp_path / name, [recorder], num_train_epochs=2, **kwargs).train()
        seen[name] = recorder.seen
        assert ("on_optimizer_end", 0, 0.0) in seen[name]  # the first step: 0 until the hook has run
    assert seen["ours"] == seen["paddlenlp"]
