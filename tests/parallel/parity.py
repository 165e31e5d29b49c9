"""Shared by the parity test files: every parallel layout trains like one process on the same global batch.

Two real processes under paddle's launcher (gloo) run ``tests/distributed/workers/parallel_toy.py``; stages 2 and
3 install the test-only shim (``cpu_sharding_shim.py``) in the workers. The reference is one process on the whole
global batch, per variant (recompute and sharding change no arithmetic). dp 2 x sharding 2 needs 4 processes,
whose groups paddle's gloo cannot build on CPU (``connect ... Connection refused`` inside ``fleet.init``, also
without this project): that layout is a GPU row (benchmarks/gpu_sharding.py).
"""

import json
import os
import subprocess
import sys

import numpy as np
from helpers import REPO, launch

WORKER = os.path.join(REPO, "tests", "distributed", "workers", "parallel_toy.py")
HIDDEN = 1040  # 1040 x 1040 = 1,081,600 weights > 2**20: stage 3 really slices the blocks' weights
VARIANTS = {
    "plain": {},
    "recompute": {"recompute": True},
    "accumulation+clip": {"accumulation": 2, "clip": 0.05},
}
STAGES = {"dp": 0, "stage1": 1, "stage2": 2, "stage3": 3}


def options(mode: str, variant: str) -> dict:
    return {"global_batch": 16, "hidden": HIDDEN, "steps": 5, "sharding": "" if mode == "dp" else mode,
            "shim": mode in ("stage2", "stage3"), **VARIANTS[variant]}


def load(out: str, rank: int):
    with open(os.path.join(out, f"result-rank{rank}.json")) as f:
        result = json.load(f)
    return result, dict(np.load(os.path.join(out, f"params-rank{rank}.npz")))


def one_process(out: str, variant: str):
    opts = options("dp", variant)
    opts.pop("recompute", None)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=REPO)
    subprocess.run([sys.executable, WORKER, out, json.dumps(opts)], check=True, env=env, cwd=REPO,
                   capture_output=True, timeout=300)
    return load(out, 0)


def check_two_ranks(mode: str, variant: str, reference, tmp_path) -> None:
    out = str(tmp_path / "two")
    os.makedirs(out)
    launch(WORKER, [out, json.dumps(options(mode, variant))], nproc=2, log_dir=str(tmp_path / "logs"), timeout=400)
    (r0, p0), (r1, p1) = load(out, 0), load(out, 1)
    ref, ref_params = reference
    stage = STAGES[mode]
    assert r0["layout"] == {"world_size": 2, "dp_degree": 1 if stage else 2, "sharding_degree": 2 if stage else 1,
                            "sharding_stage": stage, "offload": False, "mp_degree": 1, "pp_degree": 1}
    assert r0["global_step"] == ref["global_step"] == 5
    assert r0["losses"] == r1["losses"]  # logged after the cross-rank mean: every rank logs the same
    diff = np.abs(np.array(r0["losses"]) - np.array(ref["losses"])).max()
    print(f"PARITY {mode} {variant}: max loss difference {diff:.3g} over {len(ref['losses'])} steps")
    assert diff <= 1e-6, (r0["losses"], ref["losses"])
    assert abs(r0["eval_loss"] - ref["eval_loss"]) <= 1e-6 and r0["eval_loss"] == r1["eval_loss"]
    for name, value in ref_params.items():
        np.testing.assert_allclose(p0[name], value, atol=2e-6, err_msg=name)
        np.testing.assert_array_equal(p0[name], p1[name], err_msg=name)  # every rank ends with the same model
