"""Two real processes under paddle.distributed.launch (gloo on CPU) against one process."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO, launch

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "train_toy.py")


def load(out, rank):
    params = dict(np.load(os.path.join(out, f"params-rank{rank}.npz")))
    with open(os.path.join(out, f"metrics-rank{rank}.json")) as f:
        meta = json.load(f)
    return params, meta, np.load(os.path.join(out, f"pred-rank{rank}.npy"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("dp")
    two, one = str(base / "two"), str(base / "one")
    os.makedirs(two)
    os.makedirs(one)
    launch(WORKER, [two, 8], nproc=2, log_dir=str(base / "logs"))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    subprocess.run([sys.executable, WORKER, one, "16"], check=True, env=env, cwd=REPO, capture_output=True)
    return two, one


def test_both_ranks_end_identical_and_equal_to_one_process_on_the_full_batch(runs):
    two, one = runs
    p0, m0, _ = load(two, 0)
    p1, m1, _ = load(two, 1)
    ref, mref, _ = load(one, 0)
    assert m0["world_size"] == 2 and mref["world_size"] == 1
    assert m0["global_step"] == mref["global_step"] == 18
    for k in ref:
        np.testing.assert_array_equal(p0[k], p1[k], err_msg=k)
        np.testing.assert_allclose(p0[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_logged_loss_is_the_mean_over_ranks(runs):
    two, one = runs
    _, m0, _ = load(two, 0)
    _, m1, _ = load(two, 1)
    _, mref, _ = load(one, 0)
    assert m0["losses"] == m1["losses"]
    np.testing.assert_allclose(m0["losses"], mref["losses"], rtol=1e-5)


def test_evaluation_across_two_ranks_equals_one_process_on_uneven_data(runs):
    two, one = runs
    _, m0, pred0 = load(two, 0)
    _, m1, pred1 = load(two, 1)
    _, mref, pred_ref = load(one, 0)
    assert m0["metrics"]["eval_samples"] == 37 == mref["metrics"]["eval_samples"]
    untimed = [{k: v for k, v in m["metrics"].items() if not k.endswith(("_runtime", "_per_second"))} for m in (m0, m1)]
    assert untimed[0] == untimed[1]  # each rank times its own evaluation (eval_runtime), as in PaddleNLP
    assert m0["metrics"]["eval_accuracy"] == mref["metrics"]["eval_accuracy"]
    assert abs(m0["metrics"]["eval_loss"] - mref["metrics"]["eval_loss"]) < 1e-5
    assert pred0.shape == (37, 2)
    np.testing.assert_allclose(pred0, pred_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(pred0, pred1)


def test_only_rank_zero_writes_the_log(runs):
    two, _ = runs
    with open(os.path.join(two, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    assert len([r for r in lines if "loss" in r]) == 9  # 18 steps / logging_steps 2, written once
