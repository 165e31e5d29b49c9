"""A callback-based Trainer for PaddlePaddle.

The public face: :class:`Trainer`, :class:`TrainingArguments`,
:class:`TrainerState`, :class:`Event`. Names load lazily, so ``import trainer``
costs little and never imports paddlenlp.

Layout (docs/explanation/architecture.md): the loop and what it is made of stand
at this level (``trainer``, ``evaluation``, ``args``, ``state``, ``events``,
``loss``, ``recipe``, ``distributed``, ``device``, ``tensors``,
``metric_keys``, ``task``, ``process``, ``errors``); each other concern is a room
of its own, which says in its docstring what it owns, what it may import and who
uses it: ``optim/`` (the optimizer, LR schedules, clipping), ``data/`` (samplers, loaders, streams), ``checkpoint/`` (the run's
files and their owner), ``parallel/`` (the model's layout over ranks), ``deploy/`` (export, predictors), ``compat/``
(PaddleNLP and hapi at the door), ``launch/`` (paddle's launcher, restarts,
supervision) and ``cli/`` (the ``ptrain`` commands and the console). Imports
point down: ``cli`` > ``launch`` > ``checkpoint``, ``deploy``, ``data`` > the
loop's lower modules; the loop imports no launcher, command or console.
"""

import os
import sys
import warnings
from importlib import import_module
from importlib.util import find_spec

# paddle's import-time notice for building C++ extensions, which nothing here builds (trainer.cli.console.NOISE);
# filtered before paddle loads when a script imports trainer first
warnings.filterwarnings("ignore", message="No ccache found")

__version__ = "0.1.0"


from .process import record_uncaught_failures

record_uncaught_failures()  # a rank of ptrain's launcher: an uncaught ConfigError ends it with 2, never restarted


def _check_not_shadowed(name: str = "callbacks") -> None:
    """The top-level package ``callbacks`` ships beside ``trainer``; a user's ``callbacks.py`` (or folder) first on
    ``sys.path`` (a script's own folder is) hides it, and the first import deep inside the trainer fails with
    "'callbacks' is not a package". Say it at ``import trainer``, in one line, with the fix."""
    ours = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), name)
    module = sys.modules.get(name)
    try:
        spec = None if module is not None else find_spec(name)
    except (ImportError, ValueError):
        return
    where = getattr(module, "__file__", None) if module is not None else (spec.origin if spec else None)
    folders = list(getattr(module, "__path__", None) or (spec.submodule_search_locations if spec else None) or [])
    if (module is None and spec is None) or any(os.path.abspath(f) == ours for f in folders):
        return
    from .errors import ConfigError

    raise ConfigError(f"{where or (folders[0] if folders else name)} shadows paddle-trainer's {name!r} package (Python "
                      f"looks in the script's folder first): rename your {name}.py (e.g. my_{name}.py) and its imports")


_check_not_shadowed()

_EXPORTS = {
    "Trainer": "trainer.trainer",
    "EvalPrediction": "trainer.compat.outputs",
    "PredictionOutput": "trainer.compat.outputs",
    "TrainOutput": "trainer.compat.outputs",
    "TrainingArguments": "trainer.args",
    "TrainerState": "trainer.state",
    "set_seed": "trainer.seed",
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
