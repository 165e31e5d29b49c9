"""Export: at the end of training, write a checked inference model.

Events: ``on_fit_end`` (when ``state.status`` is ``completed`` or ``stopped``;
a failed run exports nothing). Only the main process writes; the other
ranks do nothing, except under tensor or pipeline parallel, where every rank
first gives its part of the weights (its slices, its stage's layers), which the
main process exports as one single-card model (``trainer.layout.merge``,
``trainer.layout.stages.whole_model``).

What it does: ``trainer.deploy.export.export_for_trainer``: ``paddle.jit.save`` the
model, load the files with ``paddle.inference``, run both on a sample batch and
raise ``TrainingError`` (surfacing from ``fit()`` as a CallbackError) when the
outputs differ beyond ``rtol``/``atol``; the export is published only when it
matches. The result (path, files, inputs, outputs, max abs difference) is
``self.result`` and ``PATH/export.json``. Under tensor parallel every rank first gives its slices of
the weights, which rank 0 exports as one single-card model (``trainer.layout.merge``).

Options:

- ``path``: export directory (default ``output_dir/inference``; files
  ``model.json``, ``model.pdiparams``, ``export.json``).
- ``input_spec``: list of ``paddle.static.InputSpec`` in ``model.forward``'s
  order; default: read off a sample batch, with a dynamic batch dimension.
- ``sample_batch``: the batch to check with (default: the first samples of
  ``eval_dataset``, else ``train_dataset``).
- ``rtol``, ``atol``: the tolerance of the check (default None: 1e-5 on CPU, 1e-2 on
  a GPU, where the check runs on the training card and tighter values are raised
  to 1e-2; see ``trainer.deploy.export``).

State saved: none.

    >>> Export(path="out/inference").path
    'out/inference'
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from trainer.checkpoint import fence
from trainer.deploy.export import ExportResult, export_for_trainer

from .base import Callback


class Export(Callback):
    order = 300  # last: after the loggers and the checkpoint callback have finished their on_fit_end

    def __init__(self, path: Optional[str] = None, input_spec: Optional[Sequence[Any]] = None,
                 sample_batch: Any = None, rtol: Optional[float] = None, atol: Optional[float] = None):
        self.path = path
        self.input_spec = input_spec
        self.sample_batch = sample_batch
        self.rtol, self.atol = rtol, atol
        self.result: Optional[ExportResult] = None

    def on_fit_end(self, trainer):
        if trainer.state.status not in ("completed", "stopped"):
            return
        if trainer.is_main_process:
            fence.check(trainer.args.output_dir)  # a run whose output_dir was taken over exports nothing into it
        # every rank: a tensor- or pipeline-parallel run's parts are put together first (a collective); rank 0 writes
        self.result = export_for_trainer(trainer, self.path, input_spec=self.input_spec,
                                         sample_batch=self.sample_batch, rtol=self.rtol, atol=self.atol)
