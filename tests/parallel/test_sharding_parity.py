"""Every parallel layout trains like one process on the same global batch: plain data parallel, sharding stage 1
(fleet's DygraphShardingOptimizer, unpatched), stages 2 and 3 (paddle's group_sharded_parallel, on CPU through
the test-only shim tests/parallel/cpu_sharding_shim.py), each plain, with recompute, and with gradient
accumulation plus clipping by the global norm. Two real processes under paddle's launcher (gloo)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO, launch

WORKER = os.path.join(REPO, "tests", "distributed", "workers", "parallel_toy.py")
HIDDEN = 1040  # 1040 x 1040 = 1,081,600 weights > 2**20: stage 3 really slices the blocks' weights
VARIANTS = {
    "plain": {},
    "recompute": {"recompute": True},
    "accumulation+clip": {"accumulation": 2, "clip": 0.05},
}
MODES = {"dp": "", "stage1": "stage1", "stage2": "stage2", "stage3": "stage3"}


def _opts(mode, variant):
    return {"global_batch": 16, "hidden": HIDDEN, "steps": 5, "sharding": MODES[mode],
            "shim": mode in ("stage2", "stage3"), **VARIANTS[variant]}


def _load(out, rank):
    with open(os.path.join(out, f"result-rank{rank}.json")) as f:
        result = json.load(f)
    return result, dict(np.load(os.path.join(out, f"params-rank{rank}.npz")))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process on the whole global batch, per variant (recompute and sharding change no arithmetic)."""
    cache = {}

    def run(variant):
        if variant not in cache:
            out = str(tmp_path_factory.mktemp(f"one-{variant.replace('+', '-')}"))
            opts = _opts("dp", variant)
            opts.pop("recompute", None)
            env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=REPO)
            subprocess.run([sys.executable, WORKER, out, json.dumps(opts)], check=True, env=env, cwd=REPO,
                           capture_output=True, timeout=300)
            cache[variant] = _load(out, 0)
        return cache[variant]

    return run


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("mode", list(MODES))
def test_two_ranks_train_like_one_process(mode, variant, reference, tmp_path):
    out = str(tmp_path / "two")
    os.makedirs(out)
    launch(WORKER, [out, json.dumps(_opts(mode, variant))], nproc=2, log_dir=str(tmp_path / "logs"), timeout=400)
    (r0, p0), (r1, p1) = _load(out, 0), _load(out, 1)
    ref, ref_params = reference(variant)
    stage = {"dp": 0, "stage1": 1, "stage2": 2, "stage3": 3}[mode]
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
