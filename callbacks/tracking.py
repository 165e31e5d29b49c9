"""Tracker: what the experiment-tracker callbacks (TensorBoard, Weights & Biases,
MLflow) share; and which ``report_to`` word switches on which of them.

==============  ==========================================  ==========================  =================
``report_to``   callback                                    extra                       import checked
==============  ==========================================  ==========================  =================
tensorboard     :class:`callbacks.tensorboard_tracker.TensorBoardTracker`  ``paddle-trainer[tensorboard]``  tensorboardX or tensorboard
wandb           :class:`callbacks.wandb_tracker.WandbTracker`  ``paddle-trainer[wandb]``  wandb
mlflow          :class:`callbacks.mlflow_tracker.MLflowTracker`  ``paddle-trainer[mlflow]``  mlflow
==============  ==========================================  ==========================  =================

``all`` in ``report_to`` means the default loggers and every tracker installed
(as PaddleNLP's ``all``). A tracker asked for by name but not installed is a
ConfigError (exit 2) when the Trainer is built, naming the extra to install.

Every tracker, on the main process only:

- ``on_fit_begin``: opens its run (or, resumed from a checkpoint, the SAME run:
  the run's id travels in the checkpoint through :meth:`Tracker.state_dict`) and
  records the run's arguments as hyper-parameters (``wandb_api_key`` left out);
- ``on_log``: every number of the record (training logs and evaluations alike)
  at ``step``, tagged as the VisualDL curves are (``train/loss``,
  ``eval/accuracy``, ``eval/val_accuracy``, ``system/cpu_percent``: see
  :meth:`callbacks.logger.Rank0Logger.tag_for`); ``step``, ``epoch`` and
  ``*_samples`` are no curves;
- ``on_fit_end`` (order 310: after :class:`callbacks.Export`, 300): the final
  metrics (the last value of every key), the exported model as an artifact
  (where the tracker has artifacts), then closes the run and waits until its
  data is on disk (or on the server): the data is complete when ``fit()``
  returns.

:func:`log_file` adds a file written after ``fit()`` (``ptrain run``'s
results.json) to each tracker's run.

A tracker that fails (server gone, disk full, a bad URI) logs one warning and
is left out for the rest of the run: it never stops training.

    >>> curve_items({"step": 10, "epoch": 0.5, "loss": 0.25, "eval_val_accuracy": 0.9, "eval_samples": 64, "note": "x"})
    [('train/loss', 0.25), ('eval/val_accuracy', 0.9)]
"""

from __future__ import annotations

import importlib.util
import logging
import math
import numbers
import os
from typing import Any, Dict, List, Optional, Tuple

from trainer.errors import ConfigError, pip_extra

from .base import Callback
from .logger import Rank0Logger

logger = logging.getLogger("trainer")

#: report_to word -> (module in callbacks, class, extra, modules of which one must be importable)
TRACKERS: Dict[str, Tuple[str, str, str, Tuple[str, ...]]] = {
    "tensorboard": ("tensorboard_tracker", "TensorBoardTracker", "tensorboard", ("tensorboardX", "tensorboard")),
    "wandb": ("wandb_tracker", "WandbTracker", "wandb", ("wandb",)),
    "mlflow": ("mlflow_tracker", "MLflowTracker", "mlflow", ("mlflow",)),
}
#: arguments never sent to a tracker
SECRET_FIELDS = ("wandb_api_key",)
_NOT_CURVES = ("step", "epoch")


def installed(name: str) -> bool:
    """Whether the tracker ``name`` (a report_to word) can be imported (nothing is imported to find out)."""
    return any(importlib.util.find_spec(module) is not None for module in TRACKERS[name][3])


def tracker_callbacks(report_to) -> List[Callback]:
    """The tracker callbacks ``report_to`` asks for; an uninstalled one is a ConfigError naming its extra."""
    import importlib

    out = []
    for name in report_to:
        if name not in TRACKERS:
            continue
        module, cls, extra, _ = TRACKERS[name]
        if not installed(name):
            raise ConfigError(f"report_to {name}: {TRACKERS[name][3][0]} is not installed: "
                              f"{pip_extra(extra)} (or leave {name} out of report_to)")
        out.append(getattr(importlib.import_module(f"{__package__}.{module}"), cls)())
    return out


def curve_items(record: dict) -> List[Tuple[str, float]]:
    """``(tag, value)`` for every finite number of a log record that is a curve."""
    out = []
    for key, value in record.items():
        if key in _NOT_CURVES or key.endswith("_samples") or isinstance(value, bool):
            continue
        if isinstance(value, numbers.Real) and math.isfinite(value):
            out.append((Rank0Logger.tag_for(key), float(value)))
    return out


def hyperparameters(args) -> Dict[str, Any]:
    """The run's arguments as flat ``name: bool | int | float | str`` (None and lists as text), secrets left out."""
    out: Dict[str, Any] = {}
    for key, value in args.to_dict().items():
        if key in SECRET_FIELDS:
            continue
        out[key] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return out


def run_name(trainer) -> str:
    """``run_name``, else the output directory's name."""
    return trainer.args.run_name or os.path.basename(os.path.abspath(trainer.args.output_dir))


def tracker_dir(trainer) -> str:
    """Where local tracker files go: ``logging_dir``, else ``output_dir``."""
    return os.path.abspath(trainer.args.logging_dir or trainer.args.output_dir)


def exported_model(trainer) -> Optional[str]:
    """The directory of the inference model ``callbacks.Export`` wrote in this fit(), if any."""
    for cb in trainer.callbacks:
        result = getattr(cb, "result", None)
        path = getattr(result, "path", None)
        if type(cb).__name__ == "Export" and path and os.path.isdir(path):
            return path
    return None


def final_metrics(trainer) -> Dict[str, float]:
    """The last value of every number logged in this run (``state.log_history``), timings included."""
    out: Dict[str, float] = {}
    for record in trainer.state.log_history:
        for key, value in record.items():
            if key != "step" and isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
                out[key] = float(value)
    out["global_step"] = trainer.state.global_step
    return out


def log_file(trainer, path: str, name: Optional[str] = None) -> None:
    """Add ``path`` (e.g. results.json, written after ``fit()``) to the run of every tracker of ``trainer``."""
    for cb in trainer.callbacks:
        if isinstance(cb, Tracker) and trainer.is_main_process:
            cb.add_file(trainer, path, name or os.path.basename(path))


class Tracker(Callback):
    """Base of the tracker callbacks: the events, rank 0, the run id in checkpoints, and failures as one warning.

    A subclass implements :meth:`start` (open or reopen the run; set ``self.run_id``), :meth:`scalars`,
    :meth:`finish` (final metrics, artifacts, close, wait), and :meth:`attach` (one file after the run closed).
    """

    order = 310  # after Export (300): its model is on disk when on_fit_end uploads it
    name = "tracker"

    def __init__(self):
        self.run_id: Optional[str] = None
        self._open = False
        self._failed = False

    # ---- what a tracker implements ------------------------------------------------
    def start(self, trainer, resumed: bool) -> None:
        raise NotImplementedError

    def scalars(self, items: List[Tuple[str, float]], step: int) -> None:
        raise NotImplementedError

    def finish(self, trainer, status: str) -> None:
        raise NotImplementedError

    def attach(self, trainer, path: str, name: str) -> None:
        """Add a file to the (closed) run; default: nothing (a tracker without artifacts)."""

    # ---- events -----------------------------------------------------------------------
    def on_fit_begin(self, trainer):
        if not trainer.is_main_process or self._failed:
            return
        resumed = bool(self.run_id) and trainer.state.global_step > 0
        self._open = self._guard("starting its run", self.start, trainer, resumed) is not False

    def on_log(self, trainer):
        if not (self._open and trainer.is_main_process):
            return
        logs = trainer.state.logs
        items = curve_items(logs)
        if items:
            self._guard("logging", self.scalars, items, int(logs.get("step") or trainer.state.global_step))

    def on_fit_end(self, trainer):
        if not (self._open and trainer.is_main_process):
            return
        self._open = False
        self._guard("closing its run", self.finish, trainer, trainer.state.status)

    def add_file(self, trainer, path: str, name: str) -> None:
        if self.run_id and not self._failed and os.path.isfile(path):
            self._guard(f"adding {name}", self.attach, trainer, path, name)

    # ---- failures: one warning, then nothing ------------------------------------------
    def _guard(self, what: str, action, *args):
        if self._failed:
            return False
        try:
            action(*args)
            return None
        except Exception as exc:  # noqa: BLE001 - a tracker never stops training
            self._failed, self._open = True, False
            logger.warning("report_to %s failed while %s (%s: %s); training goes on without it",
                           self.name, what, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            self._after_failure()
            return False

    def _after_failure(self) -> None:
        """Release what the tracker holds after a failure (best effort)."""

    # ---- state -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"run_id": self.run_id} if self.run_id else {}

    def load_state_dict(self, state: dict) -> None:
        self.run_id = state.get("run_id") or self.run_id
