"""A callback-based Trainer for PaddlePaddle.

The public face: :class:`Trainer`, :class:`TrainingArguments`,
:class:`TrainerState`, :class:`Event`. Names load lazily, so ``import trainer``
costs little and never imports paddlenlp.
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "Trainer": "trainer.trainer",
    "EvalPrediction": "trainer.trainer",
    "PredictionOutput": "trainer.trainer",
    "TrainOutput": "trainer.compat.outputs",
    "TrainingArguments": "trainer.args",
    "TrainerState": "trainer.state",
    "Event": "trainer.events",
    "TrainerError": "trainer.errors",
    "ConfigError": "trainer.errors",
    "DataError": "trainer.errors",
    "CallbackError": "trainer.errors",
    "TrainingError": "trainer.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))
