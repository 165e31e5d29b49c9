"""A callback method named like a hook but matching no event is reported when the callback is added."""

import doctest
import logging

import paddle
from helpers import ToyDataset, make_mlp

import callbacks.base
from callbacks import Callback
from trainer import Trainer, TrainingArguments


class Misspelled(Callback):
    def __init__(self):
        self.calls = 0

    def on_step_ends(self, trainer):  # the typo: on_step_end is the event
        self.calls += 1

    def on_eval_end(self, trainer):  # a real event: no warning about it
        pass


def test_misspelled_hook_warns_with_the_closest_event(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="callbacks"):
        trainer = Trainer(make_mlp(), TrainingArguments(output_dir=str(tmp_path), max_steps=2, report_to=[],
                                                        save_strategy="no", evaluation_strategy="no"),
                          train_dataset=ToyDataset(16), loss_fn=paddle.nn.CrossEntropyLoss(),
                          callbacks=[Misspelled()])
    messages = [r.getMessage() for r in caplog.records if r.name == "callbacks"]
    assert messages == ["callback Misspelled: on_step_ends is not an event and will never be called "
                        "(did you mean 'on_step_end'?)"]
    trainer.fit()
    assert trainer.callbacks.get(Misspelled).calls == 0  # what the warning says: never called


def test_add_callback_warns_too_and_far_names_list_the_events(caplog):
    class Odd(Callback):
        def on_banana(self, trainer): ...

    with caplog.at_level(logging.WARNING, logger="callbacks"):
        callbacks.base.CallbackList().add(Odd())
    (message,) = [r.getMessage() for r in caplog.records if r.name == "callbacks"]
    assert "on_banana is not an event" in message and "events are on_fit_begin" in message


def test_builtin_callbacks_raise_no_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="callbacks"):
        Trainer(make_mlp(), TrainingArguments(output_dir=str(tmp_path), amp="bf16", warmup_steps=2),
                train_dataset=ToyDataset(16), loss_fn=paddle.nn.CrossEntropyLoss())
    assert not [r for r in caplog.records if r.name == "callbacks"]


def test_docstring_examples_run():
    result = doctest.testmod(callbacks.base)
    assert result.attempted > 0 and result.failed == 0
