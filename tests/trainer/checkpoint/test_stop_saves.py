"""A run that a callback stops between save steps still saves its final state (latest = the stop step)."""

import os

import paddle
from helpers import StopAt, ToyDataset, make_mlp, params_of

from callbacks import Callback, EarlyStopping
from trainer import Trainer, TrainingArguments
from trainer.checkpoint.manifest import LATEST, read_checkpoint


def _trainer(out, callbacks, evaluation="no", save_strategy="steps"):
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=8, max_steps=20, learning_rate=0.01,
                             save_strategy=save_strategy, save_steps=4, evaluation_strategy=evaluation, eval_steps=3,
                             report_to=[], save_async=True)
    return Trainer(make_mlp(), args, train_dataset=ToyDataset(40), eval_dataset=ToyDataset(16, seed=1),
                   loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=callbacks)


def _latest(out):
    with open(os.path.join(out, "checkpoints", LATEST)) as f:
        return f.read().strip()


def test_callback_stop_between_save_steps_saves_the_final_state(tmp_path):
    t = _trainer(tmp_path, [StopAt(7)])
    state = t.fit()
    assert state.status == "stopped" and state.global_step == 7
    assert _latest(tmp_path) == "step-7"
    meta, model, _ = read_checkpoint(os.path.join(tmp_path, "checkpoints", "step-7"))
    assert meta["state"]["global_step"] == 7
    for k, v in params_of(t.model).items():
        assert (model[k] == v).all(), k


def test_early_stopping_between_save_steps_saves_the_final_state(tmp_path):
    # min_delta so large that only the first evaluation "improves": stops at the 2nd evaluation, step 6
    t = _trainer(tmp_path, [EarlyStopping(patience=1, min_delta=1e9)], evaluation="steps")
    state = t.fit()
    assert state.status == "stopped" and state.global_step == 6
    assert _latest(tmp_path) == "step-6"
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["latest", "run_id", "step-4", "step-6"]


def test_stop_at_a_save_step_saves_once_and_save_strategy_no_saves_nothing(tmp_path):
    saves = []

    class CountSaves(Callback):
        def on_save_end(self, trainer):
            saves.append(trainer.state.global_step)

    _trainer(tmp_path / "a", [StopAt(8), CountSaves()]).fit()
    assert saves == [4, 8]
    _trainer(tmp_path / "b", [StopAt(3)], save_strategy="no").fit()
    assert not os.path.exists(tmp_path / "b" / "checkpoints")
