"""paddle.callbacks (hapi) callbacks, written for ``paddle.Model.fit``, run
unchanged on this Trainer: the same hook calls in the same order as under
``paddle.Model.fit`` on the same data, ``self.params`` and ``self.model``
set, ``model.stop_training`` honoured, and paddle's built-in hapi callbacks
refused with one line naming what replaces them."""

import numpy as np
import paddle
import pytest
from helpers import ToyDataset, make_mlp

from trainer import ConfigError, Trainer, TrainingArguments


class Recorder(paddle.callbacks.Callback):
    """A custom hapi callback, as a paddle.Model.fit user writes one."""

    def __init__(self, stop_at=None):
        super().__init__()
        self.events, self.losses, self.eval_logs, self.stop_at = [], [], [], stop_at

    def on_train_begin(self, logs=None):
        self.events.append("train_begin")
        assert self.params["epochs"] and self.params["steps"] and self.model is not None

    def on_train_end(self, logs=None):
        self.events.append("train_end")

    def on_epoch_begin(self, epoch, logs=None):
        self.events.append(f"epoch_begin {epoch}")

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(f"epoch_end {epoch}")

    def on_train_batch_begin(self, step, logs=None):
        self.events.append(f"train_batch_begin {step}")

    def on_train_batch_end(self, step, logs=None):
        self.events.append(f"train_batch_end {step}")
        self.losses.append(np.asarray(logs["loss"]).reshape(-1)[0])
        if self.stop_at is not None and len(self.losses) == self.stop_at:
            self.model.stop_training = True

    def on_eval_begin(self, logs=None):
        self.events.append("eval_begin")

    def on_eval_batch_begin(self, step, logs=None):
        self.events.append(f"eval_batch_begin {step}")

    def on_eval_batch_end(self, step, logs=None):
        self.events.append(f"eval_batch_end {step}")

    def on_eval_end(self, logs=None):
        self.events.append("eval_end")
        self.eval_logs.append(dict(logs))


def accuracy(p):
    return {"acc": float((p.predictions.argmax(-1) == p.label_ids.reshape(-1)).mean())}


def run_ours(tmp_path, callback, epochs=2):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=16, per_device_eval_batch_size=16,
                             num_train_epochs=epochs, learning_rate=0.01, evaluation_strategy="epoch",
                             save_strategy="no", report_to=[], device="cpu")
    trainer = Trainer(make_mlp(), args, train_dataset=ToyDataset(96), eval_dataset=ToyDataset(32, seed=1),
                      loss_fn=paddle.nn.CrossEntropyLoss(), compute_metrics=accuracy, callbacks=[callback])
    trainer.fit()
    return trainer


def test_hook_order_matches_paddle_model_fit(tmp_path):
    theirs = Recorder()
    model = paddle.Model(make_mlp())
    model.prepare(paddle.optimizer.Adam(0.01, parameters=model.parameters()), paddle.nn.CrossEntropyLoss(),
                  paddle.metric.Accuracy())
    model.fit(ToyDataset(96), ToyDataset(32, seed=1), batch_size=16, epochs=2, verbose=0, callbacks=[theirs],
              shuffle=False)
    ours = Recorder()
    run_ours(tmp_path, ours)
    assert ours.events == theirs.events
    assert len(ours.losses) == 12 and all(np.isfinite(ours.losses))
    assert set(ours.eval_logs[-1]) >= {"loss", "acc"}  # hapi's names: no eval_ prefix


def test_stop_training_stops_after_the_step(tmp_path):
    callback = Recorder(stop_at=3)
    trainer = run_ours(tmp_path, callback, epochs=3)
    assert trainer.state.global_step == 3 and trainer.state.status == "stopped"
    assert callback.events[-1] == "train_end"


@pytest.mark.parametrize("builtin", ["ProgBarLogger", "ModelCheckpoint", "VisualDL", "LRScheduler", "EarlyStopping",
                                     "ReduceLROnPlateau"])
def test_builtin_hapi_callbacks_are_refused_with_their_replacement(tmp_path, builtin):
    cls = getattr(paddle.callbacks, builtin)
    callback = cls(log_dir=str(tmp_path)) if builtin == "VisualDL" else cls()
    with pytest.raises(ConfigError, match=rf"paddle.callbacks.{builtin} is not supported by this Trainer: use .+ instead"):
        Trainer(make_mlp(), TrainingArguments(output_dir=str(tmp_path), report_to=[]), callbacks=[callback])
