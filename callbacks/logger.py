"""Rank0Logger: progress bar, metrics.jsonl, VisualDL scalars and a PNG of the
curves, written by the main process only.

Events:

- ``on_fit_begin``: open the outputs (rank 0).
- ``on_step_end`` (dispatched only while there is a bar, see
  :meth:`callbacks.base.Callback.wants`): advance the progress bar by one step.
  Host counters only: no tensor is read, so there is no device-to-host sync
  between logging steps.
- ``on_log``: write ``trainer.state.logs`` as it stands after every callback
  of lower ``order`` has added to it. The trainer has already reduced the loss
  across ranks and added ``step``, ``epoch``, ``loss``, ``learning_rate``,
  ``samples_per_second``, ``tokens_per_second`` (batches with ``input_ids``)
  and ``grad_norm`` (clipping on); monitors add theirs (``loss_scale``,
  ``gpu0_util``, ``data_wait_share``, ...). Evaluation records
  (``trainer.log({...eval metrics})`` after ``evaluate()``) come here too.
- ``on_fit_end``: close the outputs and draw the PNG.

Options:

- ``report_to``: any of ``tqdm`` (progress bar: step/total, loss, lr, samples/s,
  ETA), ``jsonl`` (``output_dir/metrics.jsonl``, one JSON object per record;
  taken from ``args.report_to``, metrics.jsonl is always written beside what it
  names, e.g. ``report_to=["tensorboard"]``: the run's own record),
  ``visualdl`` (scalars under ``output_dir/visualdl``; view them with
  ``ptrain visualdl --logdir OUTPUT_DIR``, VisualDL's server that also answers
  clients sending no Accept-Language, see ``trainer.cli.visualdl_serve``;
  written in batches, at most every 5 s and at the end of ``fit()``, on the
  training thread by :mod:`callbacks.visualdl_records`: no writer thread, so
  nothing takes the GIL from the training thread), ``png``
  (``output_dir/curves.png``: loss and
  evaluation metrics against the step, drawn at the end of ``fit()``).
  Default: ``args.report_to``; ``args.disable_tqdm`` drops the bar.
- ``print_logs``: also print each record as one line (default: only when there
  is no bar; evaluation records are always printed, but an evaluation record
  equal to the last one printed, timings aside, is not printed again: a script's
  ``trainer.evaluate()`` after ``fit()`` evaluated the same weights at the same step).
  The bar is drawn only when stderr is a terminal; in CI logs, Slurm or under
  nohup each logging step prints one line instead of hundreds of redraws.

VisualDL tags: ``eval_<m>`` -> ``eval/<m>``, ``test_<m>`` -> ``test/<m>``,
hardware and data-loading figures (``gpu*``, ``cpu_*``, ``rss_*``,
``data_wait_*``) -> ``system/<key>``, a key that already holds a ``/`` is used
as is, everything else -> ``train/<key>``. ``step`` is the x axis; ``epoch``
and ``*_samples`` counts go to metrics.jsonl only. Only scalar numbers reach
VisualDL: **no hparams record is ever written**. With visualdl 2.5.3
and protobuf 7.34 or newer ``LogWriter.add_hparams`` raises on any boolean
value (``TypeError: Field visualdl.Record.HParam.HparamInfo.int_value: Expected
an int, got a boolean``: visualdl files a bool as an int, protobuf 7.34+
refuses it), which is how PaddleNLP's trainer crashes at train start when it
logs its arguments (the pinned protobuf, 6.33, still takes it). This logger only writes scalar records (VisualDL's
``scalar`` builder, what ``LogWriter.add_scalar`` writes) after the meta record
(``meta_data``, what ``LogWriter`` writes first), which works with the pinned
set. Keep it that way: run arguments belong in the checkpoint's
``trainer.json``, not in VisualDL hparams. A record key holding ``%`` stops the
run at its first logging step when visualdl is on (VisualDL cannot read such a
tag; ``LogWriter`` refused it too).

metrics.jsonl: one record per line, keys sorted; values that are not finite
(a NaN loss) are written as ``null`` so every line is strict JSON.

One history per output_dir. A fresh run (``global_step == 0``) starts
metrics.jsonl anew. A resumed run (or a second ``fit()`` of the same trainer)
rewrites it from ``trainer.state.log_history`` (restored from the checkpoint)
up to the current step, dropping the records of an abandoned continuation, then
appends. VisualDL shows only the newest record file of a directory, so each
``fit()`` writes a new ``vdlrecords.<time>.log`` (named to sort after, and never
to overwrite, an older one), replays the same history into it (at the replay's
wall time) and then deletes the older record files it superseded.

Records logged outside ``fit()`` (``trainer.evaluate()`` after training) are
appended to metrics.jsonl and printed; VisualDL scalars are written during
``fit()`` only (the next ``fit()`` replays them from the history).

State saved: none (the history comes from ``trainer.state.log_history``, which
the checkpoint carries). Only the main process writes: under N processes there
is exactly one metrics.jsonl and one VisualDL record per ``fit()``.

Example::

    >>> logger = Rank0Logger(report_to=["jsonl", "png"])
    >>> logger.tag_for("eval_accuracy"), logger.tag_for("loss"), logger.tag_for("gpu0_util")
    ('eval/accuracy', 'train/loss', 'system/gpu0_util')
"""

from __future__ import annotations

import glob
import json
import math
import numbers
import os
import re
import sys
import time
from typing import Iterable, List, Optional

from trainer.checkpoint import fence

from .base import Callback

SYSTEM_PREFIXES = ("gpu", "cpu_", "rss_", "data_wait_")
# Scalars are kept here and written in one batch at most every VDL_BATCH_SECONDS (VisualDL's own
# LogWriter wrote its file every flush_secs=10 s), at the end of fit(), or when VDL_BATCH_MAX are kept
VDL_BATCH_SECONDS = 5.0
VDL_BATCH_MAX = 1000
_TIMINGS = ("_runtime", "_per_second")
_JSON = json.JSONEncoder(sort_keys=True)  # json.dumps(..., sort_keys=True) builds one per call
_NOT_CURVES = ("step", "epoch")


class Rank0Logger(Callback):
    order = 100

    def __init__(self, report_to: Optional[Iterable[str]] = None, print_logs: Optional[bool] = None):
        self.report_to = list(report_to) if report_to is not None else None
        self.print_logs = print_logs
        self._bar = self._jsonl = self._vdl = None
        self._in_fit = False
        self._vdl_pending: list = []   # (tag, value, step, walltime ms) not yet written to the record file
        self._vdl_handed = 0.0         # time.monotonic() of the last write
        self._tags: dict = {}          # record key -> VisualDL tag (None: not a curve)
        self._last_eval = None  # the last evaluation record printed, without its timings

    # ---- configuration ---------------------------------------------------
    def _outputs(self, trainer) -> List[str]:
        outs = self.report_to if self.report_to is not None else list(trainer.args.report_to)
        if self.report_to is None and outs and "jsonl" not in outs:  # the run's own record, beside what report_to names
            outs = outs + ["jsonl"]
        if trainer.args.disable_tqdm:
            outs = [o for o in outs if o != "tqdm"]
        return outs

    @staticmethod
    def tag_for(key: str) -> str:
        """The VisualDL tag of a record key (see the module docstring)."""
        if "/" in key:
            return key
        for prefix in ("eval_", "test_"):
            if key.startswith(prefix):
                return prefix[:-1] + "/" + key[len(prefix):]
        if key.startswith(SYSTEM_PREFIXES):
            return "system/" + key
        return "train/" + key

    # ---- events ------------------------------------------------------------
    def on_fit_begin(self, trainer):
        if not trainer.is_main_process:
            return
        self._in_fit = True
        outs, out_dir = self._outputs(trainer), trainer.args.output_dir
        os.makedirs(out_dir, exist_ok=True)
        step = trainer.state.global_step
        history = [{k: _plain(v) for k, v in r.items()} for r in trainer.state.log_history
                   if step > 0 and int(r.get("step") or 0) <= step]
        if "jsonl" in outs:
            with fence.fenced(out_dir):  # a run that lost its output_dir (lease taken over) writes nothing
                self._jsonl = _start_jsonl(os.path.join(out_dir, "metrics.jsonl"), history)
        if "visualdl" in outs:
            self._vdl = self._start_visualdl(os.path.join(out_dir, "visualdl"), history)
        if "tqdm" in outs and _is_terminal(sys.stderr):  # CI logs, Slurm, nohup: one line per log instead
            from tqdm.auto import tqdm

            self._bar = tqdm(total=trainer.state.max_steps, initial=trainer.state.global_step,
                             desc="train", unit="step", dynamic_ncols=True, file=sys.stderr)

    def wants(self, hook: str) -> bool:
        # in fit() without a bar (stderr no terminal, or no tqdm): nothing to advance, not dispatched
        return hook != "on_step_end" or self._bar is not None or not self._in_fit

    def on_step_end(self, trainer):
        # host counter only: the loss stays on the device until the next log
        if self._bar is not None:
            self._bar.update(1)

    def on_log(self, trainer):
        if not trainer.is_main_process:
            return
        record = {k: _plain(v) for k, v in trainer.state.logs.items()}
        step = int(record.get("step") or trainer.state.global_step)
        fence.check(trainer.args.output_dir, quick=True)  # a run that lost its output_dir writes nothing (~5 us)
        if self._in_fit:
            self._write_jsonl(self._jsonl, record)
        elif "jsonl" in self._outputs(trainer):  # e.g. evaluate() after fit()
            path = os.path.join(trainer.args.output_dir, "metrics.jsonl")
            os.makedirs(trainer.args.output_dir, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                self._write_jsonl(f, record)
        if self._vdl is not None:
            self._write_scalars(record, step)
        if self._bar is not None and "loss" in record:
            post = {"loss": _fmt(record["loss"])}
            if _is_number(record.get("learning_rate")):
                post["lr"] = f"{record['learning_rate']:.2e}"
            if _is_number(record.get("samples_per_second")):
                post["samples/s"] = f"{record['samples_per_second']:.1f}"
            self._bar.set_postfix(post, refresh=False)  # drawn at the bar's next update: ~2 us instead of ~20
        is_eval = any(k.startswith(("eval_", "test_")) for k in record)
        printing = self.print_logs if self.print_logs is not None else self._bar is None
        if is_eval:  # evaluate() after fit() on the weights the last step evaluated: the same line, shown once
            same = {k: v for k, v in record.items() if not k.endswith(_TIMINGS)}
            if same == self._last_eval:
                return
            self._last_eval = same
        if printing or is_eval:
            line = " ".join(f"{k}={_fmt(v)}" for k, v in record.items())
            (self._bar.write if self._bar is not None else print)(line)

    def on_fit_end(self, trainer):
        if not trainer.is_main_process:
            return
        self._in_fit = False
        bar, jsonl, vdl = self._bar, self._jsonl, self._vdl
        self._bar = self._jsonl = self._vdl = None
        if bar is not None:
            bar.close()
        if jsonl is not None:
            jsonl.close()
        if vdl is not None:
            self._hand_scalars(vdl)
            vdl.close()
        if "png" in self._outputs(trainer) and trainer.state.log_history:
            from .plots import plot_curves

            plot_curves(trainer.state.log_history, os.path.join(trainer.args.output_dir, "curves.png"))

    # ---- helpers -------------------------------------------------------------
    @staticmethod
    def _write_jsonl(f, record: dict) -> None:
        if f is None:
            return
        f.write(_JSON.encode(_strict(record)) + "\n")
        f.flush()

    def _tag(self, key: str) -> Optional[str]:
        """The VisualDL tag of ``key``, or None for keys that are no curve (cached: ~1 us instead of ~3)."""
        try:
            return self._tags[key]
        except KeyError:
            tag = None if key in _NOT_CURVES or key.endswith("_samples") else self.tag_for(key)
            if tag is not None and "%" in tag:  # VisualDL's reader cannot take it (LogWriter refuses it too)
                raise ValueError(f"the record key {key!r} holds a '%', which a VisualDL tag cannot: rename the metric "
                                 "or leave visualdl out of report_to")
            self._tags[key] = tag
            return tag

    def _write_scalars(self, record: dict, step: int, hand: bool = True) -> None:
        walltime = round(time.time() * 1000)
        pending = self._vdl_pending
        for key, value in record.items():
            tag = self._tag(key)
            # VisualDL would draw inf/nan as spikes to a fake value
            if tag is not None and _is_number(value) and math.isfinite(value):
                pending.append((tag, float(value), step, walltime))
        if hand and (len(pending) >= VDL_BATCH_MAX or time.monotonic() - self._vdl_handed >= VDL_BATCH_SECONDS):
            self._hand_scalars(self._vdl)

    def _hand_scalars(self, vdl) -> None:
        """Write the kept scalars to the record file (on this thread: see callbacks.visualdl_records)."""
        pending, self._vdl_pending = self._vdl_pending, []
        self._vdl_handed = time.monotonic()
        vdl.write(pending)

    def _start_visualdl(self, logdir: str, history: List[dict]):
        """A new record file that sorts after the older ones, holding ``history``;
        then the older files (VisualDL would not show them) are removed."""
        from .visualdl_records import ScalarRecordFile  # scalars only: see the module docstring on hparams

        os.makedirs(logdir, exist_ok=True)
        older = {}
        for path in glob.glob(os.path.join(logdir, "vdlrecords.*")):
            m = re.match(r"vdlrecords\.(\d+)", os.path.basename(path))
            older[path] = int(m.group(1)) if m else 0
        stamp = max([int(time.time())] + [t + 1 for t in older.values()])
        self._vdl = ScalarRecordFile(os.path.join(logdir, f"vdlrecords.{stamp:010d}.log"))
        self._vdl_pending = []
        for record in history:
            self._write_scalars(record, int(record.get("step") or 0), hand=False)
        self._hand_scalars(self._vdl)
        for path in older:
            os.remove(path)
        return self._vdl


def _start_jsonl(path: str, history: List[dict]):
    """metrics.jsonl for this fit(): ``history`` written atomically, open for appending."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for record in history:
            Rank0Logger._write_jsonl(f, record)
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return open(path, "a", encoding="utf-8")


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def _is_number(value) -> bool:
    kind = type(value)
    if kind is float or kind is int:  # the common case, without the ABC check (~0.1 us instead of ~1)
        return True
    return isinstance(value, numbers.Real) and kind is not bool


def _plain(value):
    """Host Python values: numpy scalars and 0-d tensors become floats/ints (a
    sync only for a tensor, and only at log time)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if hasattr(value, "item") and getattr(value, "size", 1) == 1:
        return value.item()
    return value


def _strict(value):
    """Strict JSON: non-finite floats -> None; unknown objects -> str."""
    if isinstance(value, dict):
        return {str(k): _strict(v) for k, v in value.items()}
    if type(value) is float:  # most values of a record
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    return str(value)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
