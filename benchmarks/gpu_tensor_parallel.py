"""GPU row of ``benchmarks/gpu_check.py`` for tensor parallel: what the CPU suite runs only through the test-only
shim (tests/parallel/cpu_hybrid_shim.py), run unshimmed on the first cards.

- ``tensor_parallel``: the ERNIE-style tensor-parallel encoder (models/ernie/parallel_model.py) of
  ``tests/distributed/workers/tp_ernie.py`` trains with ``tensor_parallel_degree=2`` on 2 cards like one card on
  the same global batch (float32: max loss difference within 1e-5), with NCCL's ``all_reduce_on_calc_stream``,
  the ``c_identity`` kernel and the launcher's device id unshimmed; its export (the merged single-card model,
  checked by paddle.inference on the card) is written; so does ``tensor_parallel_config=enable_mp_async_allreduce``
  (fleet's overlapped all-reduce, whose legacy ``c_identity`` has no CPU kernel). With 4+ cards also dp 2 x mp 2,
  which paddle's gloo does not build on CPU here (2 of 4 ranks never finish creating fleet's groups).

Needs 2+ cards (SKIP otherwise). ``python benchmarks/gpu_check.py --only tensor_parallel``.
"""

from __future__ import annotations

import json
import os

from benchmarks.gpu_sharding import compare_on_cards, launch_on_cards

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "tests", "distributed", "workers", "tp_ernie.py")
STEPS = 6


def _run(tmp: str, name: str, opts: dict, cards: str) -> dict:
    out = launch_on_cards(WORKER, tmp, name, {"device": "gpu", "shim": False, "steps": STEPS, **opts}, cards)
    with open(os.path.join(out, "result-rank0.json"), encoding="utf-8") as f:
        return json.load(f)


def check_tensor_parallel(n: int, tmp: str, tolerance: float = 1e-5):
    if n < 2:
        return "SKIP", "needs 2+ cards"
    return compare_on_cards(lambda name, opts, cards: _run(tmp, name, opts, cards)["losses"], n, {"mp": 1},
                            (("mp2", {"mp": 2, "export": True}, 2),
                             # tensor_parallel_config's async all-reduce: its legacy c_identity has no CPU kernel
                             ("mp2 async allreduce", {"mp": 2, "tensor_parallel_config": "enable_mp_async_allreduce"}, 2),
                             ("dp2 x mp2", {"mp": 2}, 4)), tolerance)
