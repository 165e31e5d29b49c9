"""Loss and metric curves as a PNG (matplotlib's object API: no pyplot, no display).

Used by :class:`callbacks.Rank0Logger` at the end of ``fit()`` when ``png`` is
in ``report_to``; callable on its own with any list of log records (for
example ``trainer.state.log_history`` or the lines of ``metrics.jsonl``)::

    >>> import os, tempfile
    >>> history = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5},
    ...            {"step": 2, "eval_loss": 1.6, "eval_accuracy": 0.4, "eval_samples": 10}]
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = plot_curves(history, os.path.join(folder, "curves.png"))
    ...     open(path, "rb").read(8) == b"\\x89PNG\\r\\n\\x1a\\n"
    True

Left panel: the training loss and every evaluation loss (``eval_*loss``)
against the optimizer step. Right panel (when there are any): the other
evaluation metrics (``eval_*``; the ``eval_samples`` count is left out).
Values that are missing or not finite are skipped.
"""

from __future__ import annotations

import math
from typing import Iterable, List, Tuple


def _points(history: Iterable[dict], key: str) -> Tuple[List[float], List[float]]:
    xs, ys = [], []
    for record in history:
        value, step = record.get(key), record.get("step")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and step is not None and math.isfinite(value):
            xs.append(step)
            ys.append(float(value))
    return xs, ys


def plot_curves(history: List[dict], path: str) -> str:
    """Draw ``history``'s curves into the PNG file ``path``; returns ``path``."""
    from matplotlib.figure import Figure  # no pyplot: no global backend, no display, nothing to close

    eval_keys = sorted({k for r in history for k in r if k.startswith("eval_") and k != "eval_samples"})
    loss_keys = [k for k in eval_keys if k.endswith("loss")]
    metric_keys = [k for k in eval_keys if not k.endswith("loss")]
    panels = 2 if metric_keys else 1
    fig = Figure(figsize=(6 * panels, 4))
    axes = fig.subplots(1, panels, squeeze=False)
    ax = axes[0][0]
    xs, ys = _points(history, "loss")
    if xs:
        ax.plot(xs, ys, label="train loss")
    for key in loss_keys:
        xs, ys = _points(history, key)
        ax.plot(xs, ys, marker="o", label=key)
    ax.set_title("loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    if metric_keys:
        ax2 = axes[0][1]
        for key in metric_keys:
            xs, ys = _points(history, key)
            ax2.plot(xs, ys, marker="o", label=key)
        ax2.set_title("evaluation metrics")
        ax2.set_xlabel("step")
        ax2.grid(alpha=0.3)
        ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    return path
