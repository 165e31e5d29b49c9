"""Two ranks train like one process on the same global batch: plain data parallel and sharding stage 1
(fleet's DygraphShardingOptimizer, unpatched), each plain, with recompute, and with gradient accumulation
plus clipping by the global norm (tests/parallel/parity.py)."""

import json
import os

import numpy as np
import pytest
from helpers import launch
from parallel.parity import VARIANTS, WORKER, check_two_ranks, load, options


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("mode", ["dp", "stage1"])
def test_two_ranks_train_like_one_process(mode, variant, reference, tmp_path):
    check_two_ranks(mode, variant, reference(variant), tmp_path)


def test_ranks_agree_on_skipping_a_step_whose_gradients_only_one_rank_sees_non_finite(tmp_path):
    """Under sharding each rank holds its own unreduced gradients until the optimizer step: NaNGuard()'s loss
    scaler sums its non-finite flag over the ranks (trainer.parallel.apply.agreeing_scaler), so both skip the
    step in which rank 1 alone has a nan gradient (without the agreement rank 0 skips nothing)."""
    out = str(tmp_path / "two")
    os.makedirs(out)
    opts = {"global_batch": 16, "hidden": 64, "steps": 4, "sharding": "stage1", "nan_grad_at_step": 2}
    launch(WORKER, [out, json.dumps(opts)], nproc=2, log_dir=str(tmp_path / "logs"), timeout=400)
    (r0, p0), (r1, p1) = load(out, 0), load(out, 1)
    assert r0["skipped_steps"] == r1["skipped_steps"] == 1
    assert r0["losses"] == r1["losses"] and all(np.isfinite(r0["losses"]))
    for name in p0:
        assert np.isfinite(p0[name]).all(), name
        np.testing.assert_array_equal(p0[name], p1[name], err_msg=name)


def test_master_gradients_under_stage1_train_like_one_process(reference, tmp_path):
    """amp_master_grad (paddle's mix_precision_utils: float32 main_grad) under fleet's stage 1: on CPU the weights
    stay float32 (AMP is a no-op there), so the run must match the plain one process run."""
    out = str(tmp_path / "two")
    os.makedirs(out)
    opts = {**options("stage1", "plain"), "master_grad": True}
    launch(WORKER, [out, json.dumps(opts)], nproc=2, log_dir=str(tmp_path / "logs"), timeout=400)
    (r0, _), (r1, _) = load(out, 0), load(out, 1)
    ref, _ = reference("plain")
    assert r0["optimizer"] == "HybridParallelOptimizer" and r0["losses"] == r1["losses"]
    assert np.abs(np.array(r0["losses"]) - np.array(ref["losses"])).max() <= 1e-6
