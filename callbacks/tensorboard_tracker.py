"""TensorBoardTracker: ``report_to tensorboard``, event files for TensorBoard.

Switched on by ``report_to: [tensorboard]`` (or ``all`` when installed; the
extra ``paddle-trainer[tensorboard]`` installs tensorboardX and TensorBoard).
Rank 0 only; events, failures and the run id: :mod:`callbacks.tracking`.

Where: ``logging_dir`` (default ``output_dir``) ``/tensorboard``, then
``/<run_name>`` when ``run_name`` is set (TensorBoard names a run by its
directory). View with ``tensorboard --logdir OUTPUT_DIR/tensorboard``.

What: every logged number as a scalar at ``step`` (``train/loss``,
``eval/accuracy``, ...); the arguments as a text table (``args``) when the run
starts and as TensorBoard hyper-parameters (HParams dashboard, with the final
value of every evaluation metric) when it ends. TensorBoard has no artifacts:
the exported model's path and a file added after fit() (results.json) are
written as text.

The writer: tensorboardX's ``SummaryWriter`` when tensorboardX is installed;
else TensorBoard's own ``EventFileWriter`` with TensorBoard's summary protos
(no TensorFlow and no PyTorch needed: PaddleNLP's ``report_to tensorboard``
with only ``tensorboard`` installed writes nothing). ``writer_kind`` says which
(``tensorboardX`` or ``tensorboard``), and the first event says it too.

Resume: the directory is the run; a resumed run writes a new event file into
the same directory, starting with a purge at the resumed step, so TensorBoard
drops the steps an interrupted run logged after its checkpoint (purge step: the checkpoint's step + 1) and the curve
continues at the checkpoint's step. ``fit()`` returns after the writer is
flushed and closed.

State saved: ``run_id`` (the event directory).

    >>> TensorBoardTracker().name
    'tensorboard'
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from typing import List, Optional, Tuple

from .logger import Rank0Logger
from .tracking import Tracker, exported_model, final_metrics, hyperparameters, tracker_dir


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, prefer: Optional[str] = None):
        super().__init__()
        self.prefer = prefer  # "tensorboardX" or "tensorboard"; default: tensorboardX when installed
        self.writer_kind: Optional[str] = None
        self._writer = None

    def logdir(self, trainer) -> str:
        base = os.path.join(tracker_dir(trainer), "tensorboard")
        return os.path.join(base, trainer.args.run_name) if trainer.args.run_name else base

    def start(self, trainer, resumed: bool) -> None:
        logdir = self.logdir(trainer)
        os.makedirs(logdir, exist_ok=True)
        step = trainer.state.global_step
        # steps after the checkpoint, logged by the interrupted run, are dropped
        self._writer = open_writer(logdir, purge_step=step + 1 if resumed else None, prefer=self.prefer)
        self.writer_kind = self._writer.kind
        self.run_id = logdir
        if not resumed:
            self._writer.text("args", _table(hyperparameters(trainer.args)), step)

    def scalars(self, items: List[Tuple[str, float]], step: int) -> None:
        for tag, value in items:
            self._writer.scalar(tag, value, step)

    def finish(self, trainer, status: str) -> None:
        writer, self._writer = self._writer, None
        final = final_metrics(trainer)
        step = trainer.state.global_step
        model = exported_model(trainer)
        if model:
            writer.text("artifacts/model", f"exported model: {model}", step)
        metrics = {Rank0Logger.tag_for(k): v for k, v in final.items() if k.startswith(("eval_", "test_"))}
        writer.hparams(hyperparameters(trainer.args), metrics, step)
        writer.close()

    def attach(self, trainer, path: str, name: str) -> None:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        writer = open_writer(self.run_id, purge_step=None, prefer=self.writer_kind)
        try:
            writer.text(f"artifacts/{name}", "```\n" + text + "\n```", trainer.state.global_step)
        finally:
            writer.close()

    def _after_failure(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - already warned once
                pass


def _table(values: dict) -> str:
    rows = ["| argument | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in sorted(values.items())]
    return "\n".join(rows)


def open_writer(logdir: str, purge_step: Optional[int], prefer: Optional[str] = None):
    """A writer of event files in ``logdir``: tensorboardX's when installed (or ``prefer``), else TensorBoard's."""
    kind = prefer or ("tensorboardX" if importlib.util.find_spec("tensorboardX") is not None else "tensorboard")
    return _TensorBoardXWriter(logdir, purge_step) if kind == "tensorboardX" else _EventFileWriter(logdir, purge_step)


class _TensorBoardXWriter:
    kind = "tensorboardX"

    def __init__(self, logdir: str, purge_step: Optional[int]):
        from tensorboardX import SummaryWriter

        self._w = SummaryWriter(logdir, purge_step=purge_step, flush_secs=10)

    def scalar(self, tag: str, value: float, step: int) -> None:
        self._w.add_scalar(tag, value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        self._w.add_text(tag, text, step)

    def hparams(self, hparams: dict, metrics: dict, step: int) -> None:
        from tensorboardX.summary import hparams as hparams_summaries

        for summary in hparams_summaries(hparams, metrics):  # experiment, session start, session end
            self._w.file_writer.add_summary(summary, step)

    def close(self) -> None:
        self._w.flush()
        self._w.close()


class _EventFileWriter:
    """TensorBoard's own event file writer and summary protos: no tensorboardX, TensorFlow or PyTorch."""

    kind = "tensorboard"

    def __init__(self, logdir: str, purge_step: Optional[int]):
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._pb = event_pb2
        self._w = EventFileWriter(logdir, flush_secs=10)
        if purge_step is not None:  # what SummaryWriter(purge_step=) writes: older events from this step on are dropped
            self._w.add_event(event_pb2.Event(step=purge_step, wall_time=time.time(),
                                              session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

    def _add(self, summary, step: int) -> None:
        self._w.add_event(self._pb.Event(summary=summary, step=step, wall_time=time.time()))

    def scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboard.compat.proto import summary_pb2

        self._add(summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)]), step)

    def text(self, tag: str, text: str, step: int) -> None:
        from tensorboard.plugins.text.summary_v2 import text_pb

        self._add(text_pb(tag, text), step)

    def hparams(self, hparams: dict, metrics: dict, step: int) -> None:
        from tensorboard.plugins.hparams.summary_v2 import hparams_pb

        self._add(hparams_pb(hparams), step)
        if metrics:
            self.text("final_metrics", json.dumps(metrics, sort_keys=True), step)

    def close(self) -> None:
        self._w.flush()
        self._w.close()
