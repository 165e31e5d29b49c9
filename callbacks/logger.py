"""Rank0Logger: progress bar, metrics.jsonl and VisualDL scalars, on rank 0 only.

Events: ``on_fit_begin`` (open outputs), ``on_step_end`` (advance the bar: no
device sync), ``on_log`` (write the record the trainer reduced across ranks),
``on_fit_end`` (close). Options:

- ``report_to``: any of ``tqdm`` (progress bar with loss, lr and samples/s),
  ``jsonl`` (``output_dir/metrics.jsonl``, one JSON object per record),
  ``visualdl`` (scalars under ``output_dir/visualdl``; view with
  ``visualdl --logdir OUTPUT_DIR/visualdl``), ``png`` (loss and metric curves in
  ``output_dir/curves.png`` at the end). Default: ``args.report_to``.
- ``print_logs``: also print each record as one line (default: when there is no bar).

State saved: none. Only the main process writes: under N processes there is
exactly one metrics.jsonl and one VisualDL record.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Iterable, Optional

from .base import Callback


class Rank0Logger(Callback):
    order = 100

    def __init__(self, report_to: Optional[Iterable[str]] = None, print_logs: Optional[bool] = None):
        self.report_to = list(report_to) if report_to is not None else None
        self.print_logs = print_logs
        self._bar = self._jsonl = self._vdl = None
        self._history = []

    def _outputs(self, trainer):
        outs = self.report_to if self.report_to is not None else list(trainer.args.report_to)
        if trainer.args.disable_tqdm and "tqdm" in outs:
            outs = [o for o in outs if o != "tqdm"]
        return outs

    def on_fit_begin(self, trainer):
        if not trainer.is_main_process:
            return
        outs, out_dir = self._outputs(trainer), trainer.args.output_dir
        os.makedirs(out_dir, exist_ok=True)
        if "tqdm" in outs:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=trainer.state.max_steps, initial=trainer.state.global_step,
                             desc="train", dynamic_ncols=True, file=sys.stderr)
        if "jsonl" in outs:
            self._jsonl = open(os.path.join(out_dir, "metrics.jsonl"), "a", encoding="utf-8")
        if "visualdl" in outs:
            from visualdl import LogWriter

            self._vdl = LogWriter(logdir=os.path.join(out_dir, "visualdl"))

    def on_step_end(self, trainer):
        if self._bar is not None:
            self._bar.update(1)

    def on_log(self, trainer):
        if not trainer.is_main_process:
            return
        record = dict(trainer.state.logs)
        self._history.append(record)
        step = int(record.get("step", trainer.state.global_step))
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(record, sort_keys=True) + "\n")
            self._jsonl.flush()
        if self._vdl is not None:
            for key, value in record.items():
                if key not in ("step", "epoch") and isinstance(value, (int, float)):
                    tag = key.replace("eval_", "eval/", 1) if key.startswith("eval_") else f"train/{key}"
                    self._vdl.add_scalar(tag=tag, value=float(value), step=step)
        if self._bar is not None and "loss" in record:
            self._bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record.get('learning_rate', 0):.2e}",
                                  sps=f"{record.get('samples_per_second', 0):.0f}", refresh=False)
        printing = self.print_logs if self.print_logs is not None else self._bar is None
        if printing or any(k.startswith(("eval_", "test_")) for k in record):
            line = " ".join(f"{k}={_fmt(v)}" for k, v in record.items())
            (self._bar.write if self._bar is not None else print)(line)

    def on_fit_end(self, trainer):
        if not trainer.is_main_process:
            return
        if self._bar is not None:
            self._bar.close()
        if self._jsonl is not None:
            self._jsonl.close()
        if self._vdl is not None:
            self._vdl.close()
        self._bar = self._jsonl = self._vdl = None
        if "png" in self._outputs(trainer) and self._history:
            from .plots import plot_curves

            plot_curves(self._history, os.path.join(trainer.args.output_dir, "curves.png"))


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
