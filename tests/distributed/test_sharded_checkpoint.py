"""Sharded checkpoints for real, 2 processes: sharding stage 1 (fleet's DygraphShardingOptimizer) writes one shard
per rank under one manifest, and a resume maps them onto another layout: 2 ranks stage 1 -> 2 ranks stage 1, ->
1 rank plain, -> 2 ranks stage 2; and 1 rank plain -> 2 ranks stage 2 (stage 2 through the test-only CPU shim,
tests/parallel/cpu_sharding_shim.py). Parameters after the load equal the checkpoint's bitwise; the continued
run's losses, checkpoints (parameters and optimizer states) and final parameters are compared with the
uninterrupted stage-1 run, bitwise. Stage 3 (parameters in slices): test_sharded_checkpoint_stage3.py."""

import os
import shutil

import numpy as np
import pytest
from sharded_trials import (STOP, assert_continues_exactly, assert_export_is_the_merged_model, checkpoint, launch_fresh,
                            run_one)

from trainer import DataError
from trainer.checkpoint.manifest import read_verified, verify
from trainer.checkpoint.store import resolve


pytestmark = pytest.mark.timeout(1800)  # the runs of the module fixture happen within the first test's time


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("shard"))
    d = {name: os.path.join(base, name) for name in ("full", "async", "part", "s1s1", "s1plain1", "s1s2", "p1", "p1s2")}
    launch_fresh([d["full"], "full", "stage1"], 2, d["full"] + "-log")
    launch_fresh([d["async"], "full", "stage1", 0, "-", "async"], 2, d["async"] + "-log")
    launch_fresh([d["part"], "part", "stage1", STOP], 2, d["part"] + "-log")
    shutil.copytree(d["part"], d["s1plain1"])
    launch_fresh([d["s1s1"], "res", "stage1", 0, "auto"], 2, d["s1s1"] + "-log", copy_from=d["part"])
    d["s1plain1-log"] = run_one([d["s1plain1"], "res", "plain", 0, "auto"])
    launch_fresh([d["s1s2"], "res", "stage2", 0, "auto"], 2, d["s1s2"] + "-log", copy_from=d["part"])
    run_one([d["p1"], "part", "plain", STOP])
    launch_fresh([d["p1s2"], "res", "stage2", 0, "auto"], 2, d["p1s2"] + "-log", copy_from=d["p1"])
    return d


def test_each_rank_writes_its_own_shard_under_one_manifest(runs):
    path = os.path.join(runs["full"], "checkpoints", "step-16")
    manifest = verify(path)
    assert manifest["format_version"] == 2 and manifest["layout"]["sharded"] and manifest["layout"]["world_size"] == 2
    shards = {name: meta["rank"] for name, meta in manifest["files"].items() if name.startswith("shard-")}
    assert shards == {"shard-00000-of-00002.safetensors": 0, "shard-00001-of-00002.safetensors": 1}
    assert not os.path.exists(os.path.join(path, "model.safetensors"))
    # each optimizer state is written by the rank paddle's sharding made its owner; each tensor once
    index = manifest["tensors"]
    owners = {k: e["parts"][0]["rank"] for k, e in index.items() if k.startswith("optimizer/")}
    assert set(owners.values()) == {0, 1}
    assert all(len(e["parts"]) == 1 for e in index.values())
    ckpt = read_verified(path)
    assert sorted(ckpt.model_state) == ["0.bias", "0.weight", "2.bias", "2.weight", "4.bias", "4.weight"]
    assert len(ckpt.opt_tensors) == 6 * 4  # AdamW: two moments and two beta powers per parameter
    with open(os.path.join(runs["full"], "checkpoints", "latest")) as f:
        assert f.read().strip() == "step-16"
    assert not [n for n in os.listdir(os.path.join(runs["full"], "checkpoints")) if n.startswith(".")]


def test_an_async_save_writes_the_same_checkpoints_and_rotation_counts_them(runs):
    kept = sorted(n for n in os.listdir(os.path.join(runs["async"], "checkpoints")) if n.startswith("step-"))
    assert kept == ["step-12", "step-16", "step-8"]  # save_total_limit 3: step-4 rotated away
    for step in (8, 12, 16):
        sync, background = checkpoint(runs["full"], step), checkpoint(runs["async"], step)
        for a, b in ((sync.model_state, background.model_state), (sync.opt_tensors, background.opt_tensors)):
            assert sorted(a) == sorted(b)
            for k in a:
                assert np.array_equal(a[k], b[k]), (step, k)


@pytest.mark.parametrize("name,world", [("s1s1", 2), ("s1plain1", 1), ("s1s2", 2), ("p1s2", 2)])
def test_a_resume_onto_another_layout_continues_the_run_exactly(runs, name, world):
    # a global batch of 16 summed over 2 halves on every layout: the same arithmetic, so bitwise
    assert_continues_exactly(runs[name], runs["full"], accumulation=2 // world)


def test_the_checkpoints_a_resumed_run_writes_follow_its_own_layout(runs):
    assert verify(os.path.join(runs["s1plain1"], "checkpoints", "step-12"))["format_version"] == 1
    stage2 = verify(os.path.join(runs["s1s2"], "checkpoints", "step-12"))
    assert stage2["format_version"] == 2 and stage2["layout"]["sharding_stage"] == 2
    assert verify(os.path.join(runs["p1s2"], "checkpoints", "step-8"))["format_version"] == 1
    assert verify(os.path.join(runs["p1s2"], "checkpoints", "step-12"))["format_version"] == 2
    assert "written by 2 processes, this run has 1: the RNG states are not restored" in runs["s1plain1-log"]


@pytest.mark.parametrize("damage", ["flip", "missing"])
def test_a_damaged_or_missing_shard_is_named_and_nothing_is_loaded(runs, tmp_path, damage):
    out = str(tmp_path / "copy")
    shutil.copytree(runs["full"], out)
    ckpt = os.path.join(out, "checkpoints", "step-16")
    shard = os.path.join(ckpt, "shard-00001-of-00002.safetensors")
    if damage == "missing":
        os.remove(shard)
    else:
        with open(shard, "r+b") as f:
            f.seek(os.path.getsize(shard) - 3)
            f.write(b"\xff\xfe\xfd")
    with pytest.raises(DataError) as err:
        read_verified(ckpt)
    text = str(err.value)
    assert "\n" not in text and f"{shard} (the shard of rank 1) is missing or does not match its manifest" in text
    # auto sets it aside and resumes the newest checkpoint whose every shard verifies
    assert resolve("auto", out) == os.path.join(out, "checkpoints", "step-12")
    assert os.path.isdir(ckpt + ".damaged")
    from trainer.cli.describe import describe_checkpoint

    described = describe_checkpoint(ckpt + ".damaged")
    assert "INVALID" in described and "rank 1 shard-00001-of-00002.safetensors" in described


def test_export_writes_one_merged_inference_model(runs):
    assert_export_is_the_merged_model(runs["full"])
