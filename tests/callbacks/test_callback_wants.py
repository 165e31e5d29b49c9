"""Callback.wants: a hook a callback declines is not dispatched; asked again after on_fit_begin / on_fit_end."""

import paddle
from helpers import ToyDataset, make_mlp

from callbacks import Callback, CallbackList, NaNGuard, Rank0Logger
from trainer import Trainer, TrainingArguments
from trainer.events import Event


class Counting(Callback):
    """Counts its steps; wants on_step_end only while ``active`` (switched on at fit begin)."""

    def __init__(self):
        self.active, self.steps, self.fits = False, 0, 0

    def wants(self, hook):
        return hook != "on_step_end" or self.active

    def on_fit_begin(self, trainer):
        self.active, self.fits = True, self.fits + 1

    def on_step_end(self, trainer):
        self.steps += 1

    def on_fit_end(self, trainer):
        self.active = False


def _names(cl, event):
    return [type(cb).__name__ for cb in cl.handlers(event)]


def test_a_declined_hook_is_left_out_until_fit_begin_asks_again(tmp_path):
    counting = Counting()
    cl = CallbackList([counting])
    assert not cl.has_handlers(Event.STEP_END) and cl.has_handlers(Event.FIT_BEGIN)
    trainer = Trainer(make_mlp(), TrainingArguments(output_dir=str(tmp_path), max_steps=5, report_to=[],
                                                    save_strategy="no"),
                      train_dataset=ToyDataset(64), loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[counting])
    trainer.fit()
    assert counting.steps == 5 and counting.fits == 1  # dispatched during fit() only
    assert "Counting" not in _names(trainer.callbacks, Event.STEP_END)  # asked again after on_fit_end


def test_built_ins_decline_what_they_have_nothing_to_do_for(tmp_path):
    stop = NaNGuard(action="stop", check_gradients=False)
    assert not stop.wants("on_optimizer_step_begin") and stop.wants("on_optimizer_step_end")
    assert NaNGuard(action="stop").wants("on_optimizer_step_begin") and NaNGuard().wants("on_optimizer_step_begin")
    # Rank0Logger: no bar in fit() (stderr is no terminal under pytest) -> its on_step_end is not dispatched
    seen = {}

    class Look(Callback):
        order = 10_000

        def on_step_end(self, trainer):
            seen["step_end"] = _names(trainer.callbacks, Event.STEP_END)

    logger = Rank0Logger(report_to=["jsonl"])
    assert logger.wants("on_step_end")  # outside fit(): listed (describe_callbacks shows it)
    trainer = Trainer(make_mlp(), TrainingArguments(output_dir=str(tmp_path), max_steps=3, report_to=["jsonl"],
                                                    save_strategy="no"),
                      train_dataset=ToyDataset(64), loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[logger, Look()])
    trainer.fit()
    assert "Rank0Logger" not in seen["step_end"] and "FlowControl" in seen["step_end"]
    assert "Rank0Logger" in _names(trainer.callbacks, Event.STEP_END)  # after fit(): asked again
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1  # it still logged (step 3, the last)
