"""GPU rows of ``benchmarks/gpu_check.py`` for pipeline parallel: what the CPU suite runs only through the test-only
shim (tests/parallel/cpu_hybrid_shim.py: ``ParallelEnv.device_id``, send/recv on the calculation stream), run
unshimmed on the first cards.

- ``pipeline_parallel``: the ERNIE-style model of ``tests/distributed/workers/pipeline_ernie.py`` over 2 stages
  (models/ernie/pipeline.py's ErniePipe, paddle's 1F1B schedule over NCCL's point-to-point calls) with 2 and 4
  micro-batches trains like one card on the same global batch (float32: max loss difference within 1e-5), and
  its export (the stages merged into the single-card model, checked by paddle.inference on the card) is written.
  With 4+ cards also dp 2 x pp 2 (4 processes: not run on CPU).
- ``pipeline_parallel_failure``: stage 1 is killed (SIGKILL) in step 3 while stage 0 waits in an NCCL receive,
  which a SIGTERM cannot interrupt: the job must still end within ``BOUND_S`` (paddle's launcher: its 2 s watch,
  then SIGTERM and SIGKILL 3 s later) with a restartable code (1), not after NCCL's timeout.

Needs 2+ cards (SKIP otherwise). ``python benchmarks/gpu_check.py --only pipeline_parallel``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from benchmarks.gpu_sharding import compare_on_cards, launch_on_cards

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "tests", "distributed", "workers", "pipeline_ernie.py")
STEPS = 6
BOUND_S = 60.0


def _run(tmp: str, name: str, opts: dict, cards: str) -> dict:
    """rank 0's logged losses by step (the last stage's, broadcast to every stage)."""
    out = launch_on_cards(WORKER, tmp, name, {"device": "gpu", "shim": False, "steps": STEPS, **opts}, cards)
    with open(os.path.join(out, "result-rank0.json"), encoding="utf-8") as f:
        return dict(enumerate(json.load(f)["losses"]))


def check_pipeline_parallel(n: int, tmp: str, tolerance: float = 1e-5):
    if n < 2:
        return "SKIP", "needs 2+ cards"
    modes = (("pp2 x 2 micro", {"pp": 2, "accumulation": 2, "export": True}, 2),
             ("pp2 x 4 micro", {"pp": 2, "accumulation": 4}, 2), ("dp2 x pp2", {"pp": 2, "accumulation": 2}, 4))
    return compare_on_cards(lambda name, opts, cards: _run(tmp, name, opts, cards), n, {"pp": 1}, modes, tolerance)


def check_pipeline_failure(n: int, tmp: str):
    if n < 2:
        return "SKIP", "needs 2+ cards"
    out = os.path.join(tmp, "pp-crash")
    os.makedirs(out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = {"pp": 2, "steps": 20, "accumulation": 2, "device": "gpu", "crash_at_step": 3, "crash_how": "kill"}
    cmd = [sys.executable, "-m", "trainer.cli", "launch", "--gpus", "0,1", "--max_restarts", "0", "--master",
           f"127.0.0.1:{port}", "--log_dir", os.path.join(out, "log"), WORKER, out,
           json.dumps(opts, separators=(",", ":"))]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=REPO, check=False)
    ended = time.time()
    with open(os.path.join(out, "crashed-at"), encoding="utf-8") as f:
        took = ended - float(f.read())
    ok = proc.returncode == 1 and took <= BOUND_S
    return ("PASS" if ok else "FAIL"), f"stage 1 killed: job ended {took:.1f} s later (bound {BOUND_S:.0f} s), exit " \
        f"{proc.returncode} (expected 1, restartable)"
