"""Where a lone request runs when ``--workers`` is not given: the predictor process, or the server process for a tiny model.

A predictor process costs every request two process wake-ups and a pickled
round trip through a pipe (~0.2 ms on an idle core, several ms on a loaded
one). For a model whose call takes less than that (the digits MLP: 0.05 ms on
32 rows) the hop is most of a lone request's time: a hand-written server that
runs the model in its handler answers it faster. Under load it is the other
way round: the predictor process batches requests and computes on another
core while the server parses the next ones.

So by default (``ServeConfig.workers`` None) each model gets one predictor
process, which measures its warm call on ``max_batch_size`` rows (CPU time,
``worker.load_checked``). A CPU model under ``--inline_max_ms`` (default 1 ms)
is loaded in the server process too (the same files: fingerprints compared)
and its :class:`~trainer.deploy.batching.Batcher` runs a request there when
nothing else is queued, read or unanswered (a lone request); every other
request queues and batches in the predictor process as before.

What that costs: the model's memory twice (a tiny model), and crash isolation
for lone requests (a crash of the runtime in the server process ends the
server; the predictor process is still restarted when it dies).
``--workers N`` (N >= 1) keeps every request in predictor processes,
``--inline_max_ms 0`` does for every default model, ``--workers 0`` runs every
request in the server process. A GPU model never runs in the server process.
"""

from __future__ import annotations

import logging
from typing import Optional

from .inline import InlinePool
from .pool import ServeStartError

logger = logging.getLogger("trainer.serve")

INLINE_MAX_MS = 1.0  # a model whose warm call on a full batch takes less also runs lone requests in the server process


def runs_inline(call_ms: Optional[float], workers: Optional[int], device: str, inline_max_ms: float) -> bool:
    """Whether a model measured at ``call_ms`` (None: not measured, inputs of unknown shape) runs lone requests in
    the server process: only when ``--workers`` was not given, on the CPU, under ``inline_max_ms``."""
    return workers is None and device == "cpu" and call_ms is not None and call_ms < inline_max_ms


async def place(model, workers: Optional[int], device: str, inline_max_ms: float, metrics=None) -> Optional[str]:
    """Load ``model`` (a ``ServedModel`` whose predictor process is ready) in the server process too when
    :func:`runs_inline` says so; the line that says where its requests run and why (None when the flags decided)."""
    call_ms = (model.pool.spec or {}).get("call_ms")
    if not runs_inline(call_ms, workers, device, inline_max_ms):
        if workers is None and device == "cpu" and call_ms is not None and inline_max_ms > 0:
            return (f"model {model.name} runs in its predictor process: its call on a full batch takes "
                    f"{call_ms:.2f} ms, over --inline_max_ms {inline_max_ms:g}")
        return None
    inline = InlinePool(model.pool.options, metrics, model.pool.start_timeout)
    try:
        await inline.start(model.pool.start_timeout)  # options carry the fingerprint: other files are refused
    except ServeStartError as exc:
        return f"model {model.name} runs in its predictor process only: {exc}"
    model.inline = model.batcher.inline = inline
    return (f"model {model.name}: a lone request runs in the server process (its call on a full batch takes "
            f"{call_ms:.2f} ms, under --inline_max_ms {inline_max_ms:g}), requests under load batch in its predictor "
            "process (--workers 1: every request there)")
