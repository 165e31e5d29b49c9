"""PaddleNLP's own callback event-flow cases (tests/trainer/test_trainer_callback.py
in PaddleNLP), rewritten for this project: a recording PaddleNLP
``TrainerCallback`` must see the same hook calls, in the same order, under
PaddleNLP's Trainer and under ours, for every case, and both must match the
expected sequence PaddleNLP's test derives from the arguments. Also: adding,
popping and removing PaddleNLP callbacks by class or instance, control flags
honoured, and hooks named in errors.
"""

import importlib.util
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import CallbackError, Trainer  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("paddlenlp") is None, reason="paddlenlp is not installed")


@pytest.fixture(scope="module")
def nlp():
    """PaddleNLP's classes and this file's callbacks built on them (imported here, not at collection)."""
    import event_flow_parts

    return event_flow_parts


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
def test_event_flow_matches_paddlenlp(nlp, case, tmp_path):
    kwargs = dict(num_train_epochs=3, **CASES.get(case, MORE_CASES.get(case)))
    streams = {}
    for name, cls in (("paddlenlp", nlp.PaddleNLPTrainer), ("ours", Trainer)):
        recorder = nlp.Recorder(nlp.HOOKS + nlp.EXTRA_HOOKS if case in MORE_CASES else nlp.HOOKS)
        trainer = nlp.make(cls, tmp_path / name, [recorder], **kwargs)
        trainer.train()
        streams[name] = recorder.events
    if case in MORE_CASES:
        assert streams["ours"] == streams["paddlenlp"]
        return
    args = nlp.PaddleNLPArguments(str(tmp_path / "x"), **kwargs)
    expected = nlp.expected_events(args, 3, train_batches=8, eval_batches=8)
    assert streams["paddlenlp"] == expected  # the reference: PaddleNLP's own rule on this paddlenlp
    assert streams["ours"] == expected


def test_callback_classes_instances_add_pop_remove(nlp, tmp_path):
    recorder = nlp.Recorder()
    trainer = nlp.make(Trainer, tmp_path, [recorder, nlp.PrinterCallback])  # a class is instantiated, as in PaddleNLP
    handler = trainer.pop_callback(nlp.PrinterCallback)
    assert isinstance(handler, nlp.PrinterCallback)
    assert trainer.pop_callback(nlp.PrinterCallback) is None
    trainer.add_callback(nlp.PrinterCallback())
    trainer.remove_callback(nlp.PrinterCallback)
    assert trainer.pop_callback(recorder) is recorder
    trainer.add_callback(recorder)
    trainer.train()
    assert recorder.events[:2] == ["on_init_end", "on_train_begin"]  # on_init_end once, at construction
    assert recorder.events[-1] == "on_train_end"



def test_control_flags_are_honoured(nlp, tmp_path):
    for cls in (nlp.PaddleNLPTrainer, Trainer):
        recorder, evaluator = nlp.Recorder(), nlp.EvaluateAtStep2()
        trainer = nlp.make(cls, tmp_path / cls.__module__, [nlp.StopAtStep3(), evaluator, recorder], num_train_epochs=3)
        out = trainer.train()
        assert out.global_step == 3, cls
        assert recorder.events.count("on_save") == 1 and recorder.events.count("on_evaluate") == 1, cls
        assert "eval_loss" in evaluator.metrics
        # PaddleNLP ends the epoch it leaves early; so do we
        assert recorder.events[-4:] == ["on_save", "on_epoch_end", "on_log", "on_train_end"], (cls, recorder.events[-6:])



def test_an_error_names_the_paddlenlp_callback_and_hook(nlp, tmp_path):
    trainer = nlp.make(Trainer, tmp_path, [nlp.Broken()])
    with pytest.raises(CallbackError, match=r"callback Broken failed in on_step_end: KeyError"):
        trainer.train()


def test_state_seen_by_paddlenlp_callbacks(nlp, tmp_path):
    seen = []

    class Look(nlp.TrainerCallback):
        def on_log(self, args, state, control, logs=None, model=None, optimizer=None, lr_scheduler=None, **kwargs):
            seen.append((state.global_step, state.epoch, len(state.log_history), dict(logs), model is not None,
                         optimizer is not None, lr_scheduler is not None, state.is_world_process_zero))

    trainer = nlp.make(Trainer, tmp_path, [Look()], num_train_epochs=1, logging_steps=4)
    trainer.train()
    step, epoch, history, logs, *present = seen[0]
    assert (step, epoch, history) == (4, 0.5, 1) and "loss" in logs and all(present)
    assert seen[-1][3].get("train_loss") is not None  # train()'s summary log


def test_paddlenlp_early_stopping_stops_both_trainers_at_the_same_step(nlp, tmp_path):
    kwargs = dict(num_train_epochs=3, learning_rate=1e-9, evaluation_strategy="steps", eval_steps=4, save_steps=4,
                  load_best_model_at_end=True, metric_for_best_model="loss")
    streams, steps = {}, {}
    for name, cls in (("paddlenlp", nlp.PaddleNLPTrainer), ("ours", Trainer)):
        recorder = nlp.Recorder()
        stopper = nlp.EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=0.01)
        trainer = nlp.make(cls, tmp_path / name, [stopper, recorder], **kwargs)
        steps[name] = trainer.train().global_step
        streams[name] = recorder.events
    assert steps["paddlenlp"] == steps["ours"] == 12  # evaluations at 4 (best), 8, 12: no improvement twice
    assert streams["ours"] == streams["paddlenlp"]



@pytest.mark.parametrize("kwargs", [{"logging_steps": 5}, {"gradient_accumulation_steps": 2, "logging_steps": 3}])
def test_hook_time_state_matches_paddlenlp(nlp, kwargs, tmp_path):
    """global_step and epoch at each hook, on_optimizer_begin/_end included, as under PaddleNLP's Trainer."""
    seen = {}
    for name, cls in (("paddlenlp", nlp.PaddleNLPTrainer), ("ours", Trainer)):
        recorder = nlp.StateRecorder()
        nlp.make(cls, tmp_path / name, [recorder], num_train_epochs=2, **kwargs).train()
        seen[name] = recorder.seen
        assert ("on_optimizer_end", 0, 0.0) in seen[name]  # the first step: 0 until the hook has run
    assert seen["ours"] == seen["paddlenlp"]
