"""Sharding stage 3 checkpoints for real, 2 processes through the test-only CPU shim (tests/parallel/cpu_sharding_shim.py):
a 1040 x 1040 layer, above the 2**20 values from which paddle's stage 3 splits a parameter, is held in slices; each
rank saves its slice of it and of its optimizer states as a range of the whole tensor. Resumes: stage 3 -> stage 3,
-> 1 rank plain, -> stage 1; 1 rank plain -> stage 3 (the whole optimizer state cut to each rank's slice), all
continuing the uninterrupted stage-3 run bitwise."""

import json
import os
import shutil

import numpy as np
import pytest
from sharded_trials import (STOP, assert_continues_exactly, assert_export_is_the_merged_model, checkpoint, launch_fresh,
                            result, run_one)

from trainer.checkpoint.manifest import verify


pytestmark = pytest.mark.timeout(1800)  # the runs of the module fixture happen within the first test's time


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("stage3"))
    d = {name: os.path.join(base, name) for name in ("full", "part", "s3s3", "s3plain1", "s3s1", "p1", "p1s3")}
    launch_fresh([d["full"], "full", "stage3:wide"], 2, d["full"] + "-log")
    launch_fresh([d["part"], "part", "stage3:wide", STOP], 2, d["part"] + "-log")
    shutil.copytree(d["part"], d["s3plain1"])
    launch_fresh([d["s3s3"], "res", "stage3:wide", 0, "auto"], 2, d["s3s3"] + "-log", copy_from=d["part"])
    run_one([d["s3plain1"], "res", "plain:wide", 0, "auto"])
    launch_fresh([d["s3s1"], "res", "stage1:wide", 0, "auto"], 2, d["s3s1"] + "-log", copy_from=d["part"])
    run_one([d["p1"], "part", "plain:wide", STOP])
    launch_fresh([d["p1s3"], "res", "stage3:wide", 0, "auto"], 2, d["p1s3"] + "-log", copy_from=d["p1"])
    return d


def test_each_rank_saves_its_slice_of_the_split_parameter(runs):
    manifest = verify(os.path.join(runs["full"], "checkpoints", "step-16"))
    assert manifest["format_version"] == 2 and manifest["layout"]["sharding_stage"] == 3
    entry = manifest["tensors"]["model/2.weight"]
    assert entry["shape"] == [1040, 1040]
    ranges = sorted((p["rank"], tuple(p["flat"])) for p in entry["parts"])
    # rank 0 the first range, rank 1 the rest (paddle pads the flattened tensor, so the cut is near the half)
    assert [r for r, _ in ranges] == [0, 1] and ranges[0][1][0] == 0 and ranges[0][1][1] == ranges[1][1][0]
    assert ranges[1][1][1] == 1040 * 1040 and abs(ranges[0][1][1] - 540800) < 1024
    moments = manifest["tensors"]["optimizer/param:2.weight_moment1_0"]
    assert sorted((p["rank"], tuple(p["flat"])) for p in moments["parts"]) == ranges
    small = manifest["tensors"]["model/0.weight"]  # below the segment size: whole on every rank, written once
    assert len(small["parts"]) == 1 and "flat" not in small["parts"][0]
    # each rank wrote about half the checkpoint, at the same time
    sizes = [meta["bytes"] for name, meta in sorted(manifest["files"].items()) if name.startswith("shard-")]
    assert len(sizes) == 2 and max(sizes) < 0.55 * sum(sizes)
    whole = checkpoint(runs["full"], 16)
    assert whole.model_state["2.weight"].shape == (1040, 1040)
    assert whole.opt_tensors["param:2.weight_moment2_0"].shape == (1040, 1040)


@pytest.mark.parametrize("name,world", [("s3s3", 2), ("s3plain1", 1), ("s3s1", 2), ("p1s3", 2)])
def test_a_resume_onto_another_layout_continues_the_stage3_run_exactly(runs, name, world):
    assert_continues_exactly(runs[name], runs["full"], accumulation=2 // world)


def test_the_whole_tensor_is_the_same_whichever_layout_saved_it(runs):
    # step 8 of the 1-process run against step 8 of the stage-3 run: the same training, saved whole vs in slices
    plain, sliced = checkpoint(runs["p1"], STOP), checkpoint(runs["part"], STOP)
    with open(os.path.join(runs["part"], "checkpoints", f"step-{STOP}", "manifest.json")) as f:
        assert json.load(f)["format_version"] == 2
    for a, b in ((plain.model_state, sliced.model_state), (plain.opt_tensors, sliced.opt_tensors)):
        assert sorted(a) == sorted(b)
        for k in a:
            assert np.array_equal(a[k], b[k]), k


def test_export_of_a_stage3_run_is_refused_in_one_line_and_its_checkpoint_exports_merged(runs, tmp_path):
    import paddle
    from helpers import ToyDataset

    from trainer import Trainer, TrainingArguments
    from trainer.checkpoint.load import load_weights

    refused = result(runs["full"], "full")["export_refused"]
    assert refused.startswith("export: this run holds its parameters in slices (sharding stage3)") and "\n" not in refused
    out = str(tmp_path / "one")
    shutil.copytree(os.path.join(runs["full"], "checkpoints"), os.path.join(out, "checkpoints"))
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(8, 1040), paddle.nn.ReLU(), paddle.nn.Linear(1040, 1040),
                                 paddle.nn.ReLU(), paddle.nn.Linear(1040, 2))
    load_weights(model, os.path.join(out, "checkpoints", "step-16"))
    Trainer(model, TrainingArguments(output_dir=out, report_to=[], device="cpu"), train_dataset=ToyDataset(128)).export()
    assert_export_is_the_merged_model(out)
