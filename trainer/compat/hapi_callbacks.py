"""HapiCallbacks: runs ``paddle.callbacks.Callback`` subclasses (the callbacks
of ``paddle.Model.fit``) on this project's events.

=================================  =======================================  ==========================
hapi hook                          fired on                                 logs
=================================  =======================================  ==========================
on_train_begin / on_train_end      ``fit_begin`` / ``fit_end`` (not after   {}
                                   an error)
on_epoch_begin(epoch)              ``epoch_begin``                          {}
on_epoch_end(epoch, logs)          ``epoch_end``                            loss, step, batch_size
on_train_batch_begin(step, logs)   ``step_begin`` (step: index in epoch)    {}
on_train_batch_end(step, logs)     ``step_end``                             loss, step, batch_size
on_eval_begin(logs)                ``eval_begin``                           steps, metrics
on_eval_batch_begin/end(step,      ``eval_step_begin`` / ``_end``           step, batch_size
logs)
on_eval_end(logs)                  ``eval_end``                             loss and compute_metrics'
                                                                            values, without the
                                                                            ``eval_`` prefix
on_predict_begin / on_predict_end  ``predict_begin`` / ``predict_end``      {}
=================================  =======================================  ==========================

``loss`` is a one-element list, as in hapi; it is read from the device only
when a callback reads it (``logs['loss']``), so a callback that does not look
at it costs no host sync. ``self.params`` holds ``batch_size``, ``epochs``,
``steps`` (per epoch), ``verbose`` (0) and ``metrics``; ``self.model`` is a
small facade: ``network`` (the model), ``stop_training`` (set it to stop after
the current step; hapi stops after the epoch), ``save(path)`` /
``load(path)`` (``path.pdparams`` and, with ``training``, ``path.pdopt``) and
``parameters()``.

paddle's built-in hapi callbacks are refused with one line naming what
replaces each (``UNSUPPORTED``): the trainer already does their job.
"""

from __future__ import annotations

import math

import paddle

from trainer.errors import ConfigError

from .foreign import ForeignCallbacks

UNSUPPORTED = {
    "ProgBarLogger": "the progress bar of callbacks.Rank0Logger (report_to tqdm)",
    "ModelCheckpoint": "callbacks.Checkpoint (save_strategy, save_steps, save_total_limit)",
    "VisualDL": "callbacks.Rank0Logger (report_to visualdl)",
    "LRScheduler": "the trainer, which steps lr_scheduler after every optimizer step",
    "EarlyStopping": "callbacks.EarlyStopping(metric=..., patience=...)",
    "ReduceLROnPlateau": "a callbacks.Callback that lowers the learning rate in on_eval_end",
    "WandbCallback": "a callbacks.Callback that logs trainer.state.logs in on_log",
}


def check_supported(callback) -> None:
    from paddle import callbacks as hapi

    for name, instead in UNSUPPORTED.items():
        builtin = getattr(hapi, name, None)
        if builtin is not None and isinstance(callback, builtin):
            raise ConfigError(f"paddle.callbacks.{name} is not supported by this Trainer: use {instead} instead "
                              f"(paddle's built-in hapi callbacks not supported: {', '.join(UNSUPPORTED)})")


class HapiModel:
    """What a hapi callback reaches through ``self.model``."""

    def __init__(self, trainer):
        self._trainer = trainer
        self.stop_training = False

    @property
    def network(self) -> paddle.nn.Layer:
        return self._trainer.model

    @property
    def _optimizer(self):
        return self._trainer.optimizer

    def parameters(self, *args, **kwargs):
        return self._trainer.model.parameters(*args, **kwargs)

    def save(self, path: str, training: bool = True) -> None:
        if not self._trainer.is_main_process:
            return
        paddle.save(self._trainer.model.state_dict(), path + ".pdparams")
        if training and self._trainer.optimizer is not None:
            paddle.save(self._trainer.optimizer.state_dict(), path + ".pdopt")

    def load(self, path: str) -> None:
        self._trainer.model.set_state_dict(paddle.load(path + ".pdparams"))


class _Logs(dict):
    """A hapi logs dict whose ``loss`` is read from the device only when asked for."""

    def __init__(self, loss_tensor, **values):
        super().__init__(**values)
        self._loss = loss_tensor

    def _fill(self):
        if self._loss is not None and not dict.__contains__(self, "loss"):
            dict.__setitem__(self, "loss", [float(self._loss)])  # the one host sync, only when read

    def __getitem__(self, key):
        if key == "loss":
            self._fill()
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        if key == "loss":
            self._fill()
        return dict.get(self, key, default)

    def __contains__(self, key):
        return key == "loss" and self._loss is not None or dict.__contains__(self, key)

    def _all(self):
        self._fill()
        return self

    def items(self):
        return dict.items(self._all())

    def keys(self):
        return dict.keys(self._all())

    def values(self):
        return dict.values(self._all())

    def __iter__(self):
        return dict.__iter__(self._all())

    def __repr__(self):
        return dict.__repr__(self._all())


class HapiCallbacks(ForeignCallbacks):
    order = 50

    def __init__(self):
        super().__init__()
        self._model = None
        self._eval_step = 0
        self._last_logs: dict = {}

    @property
    def state_key(self) -> str:
        return "HapiCallbacks"

    def append(self, callback) -> None:
        cb = self.instance(callback)
        check_supported(cb)
        self.callbacks.append(cb)

    def _call(self, trainer, hook: str, *args) -> None:
        for cb in list(self.callbacks):
            self.invoke(cb, hook, *args)
        if self._model is not None and self._model.stop_training:
            trainer.state.should_stop = True

    def _batch_logs(self, trainer, with_loss: bool) -> dict:
        s = trainer.state
        return _Logs(s.step_loss if with_loss else None, step=s.step_in_epoch - 1, batch_size=trainer.args.per_device_train_batch_size)

    # ---- events ---------------------------------------------------------------------
    def on_fit_begin(self, trainer):
        s, a = trainer.state, trainer.args
        self._model = HapiModel(trainer)
        params = {"batch_size": a.per_device_train_batch_size, "epochs": s.num_train_epochs,
                  "steps": s.steps_per_epoch, "verbose": 0, "metrics": ["loss"]}
        for cb in self.callbacks:
            cb.set_params(params)
            cb.set_model(self._model)
        self._call(trainer, "on_train_begin", {})

    def on_epoch_begin(self, trainer):
        self._call(trainer, "on_epoch_begin", trainer.state.epoch, {})

    def on_step_begin(self, trainer):
        self._call(trainer, "on_train_batch_begin", trainer.state.step_in_epoch, {})

    def on_step_end(self, trainer):
        self._last_logs = self._batch_logs(trainer, with_loss=True)
        self._call(trainer, "on_train_batch_end", trainer.state.step_in_epoch - 1, self._last_logs)

    def on_epoch_end(self, trainer):
        self._call(trainer, "on_epoch_end", trainer.state.epoch - 1, self._last_logs)

    def on_eval_begin(self, trainer):
        self._eval_step = 0
        self._call(trainer, "on_eval_begin", {"steps": self._eval_steps(trainer), "metrics": ["loss"]})

    def on_eval_step_begin(self, trainer):
        self._call(trainer, "on_eval_batch_begin", self._eval_step, {})

    def on_eval_step_end(self, trainer):
        self._call(trainer, "on_eval_batch_end", self._eval_step,
                   {"step": self._eval_step, "batch_size": trainer.args.per_device_eval_batch_size})
        self._eval_step += 1

    def on_eval_end(self, trainer):
        logs = {}
        for key, value in trainer.state.metrics.items():
            name = key[len("eval_"):] if key.startswith("eval_") else key
            logs[name] = [value] if name == "loss" else value
        self._call(trainer, "on_eval_end", logs)

    def on_predict_begin(self, trainer):
        self._call(trainer, "on_predict_begin", {})

    def on_predict_end(self, trainer):
        self._call(trainer, "on_predict_end", {})

    def on_fit_end(self, trainer):
        if trainer.state.status != "failed":
            self._call(trainer, "on_train_end", dict(self._last_logs))

    @staticmethod
    def _eval_steps(trainer) -> int:
        sets = trainer.eval_dataset.values() if isinstance(trainer.eval_dataset, dict) else [trainer.eval_dataset]
        try:
            sizes = [len(s) for s in sets]
        except TypeError:
            return 0
        return sum(math.ceil(math.ceil(n / trainer.world_size) / trainer.args.per_device_eval_batch_size) for n in sizes)
