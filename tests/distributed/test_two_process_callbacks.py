"""LRWarmup, EarlyStopping and Export under two real processes (paddle.distributed.launch, gloo on CPU)."""

import json
import os

import pytest
from helpers import launch

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "callbacks_toy.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    base = tmp_path_factory.mktemp("dp-callbacks")
    out = str(base / "out")
    os.makedirs(out)
    launch(WORKER, [out], nproc=2, log_dir=str(base / "logs"))
    results = []
    for rank in (0, 1):
        with open(os.path.join(out, f"callbacks-rank{rank}.json")) as f:
            results.append(json.load(f))
    return out, results


def test_every_rank_stops_at_the_same_step(ranks):
    _, (r0, r1) = ranks
    assert r0["status"] == r1["status"] == "stopped"
    assert r0["global_step"] == r1["global_step"] == 6  # evaluations at 2 (best), 4, 6
    assert r0["stopper"] == r1["stopper"]


def test_linear_scaling_uses_the_global_batch(ranks):
    _, (r0, r1) = ranks
    # global batch = 4 per device x 2 processes = 8, reference 4: peak = 2 x 1e-9, reached after 3 warmup steps
    assert r0["global_batch"] == 8
    assert r0["lrs"] == r1["lrs"]
    assert r0["lrs"][3] == pytest.approx(2e-9) and r0["lrs"][0] == pytest.approx(0.5e-9)


def test_only_rank_0_exports(ranks):
    out, (r0, r1) = ranks
    assert r1["export"] is None
    assert r0["export"]["path"] == os.path.join(out, "inference") and r0["export"]["max_abs_diff"] < 1e-5
    assert sorted(os.listdir(os.path.join(out, "inference"))) == ["export.json", "model.json", "model.pdiparams"]
