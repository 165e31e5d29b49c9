"""Seconds-long smoke runs of the benchmark scripts, so they keep working.

Not measurements: a few steps each, to catch API drift (ours, PaddleNLP's,
paddle's) and broken plumbing. Each script runs the way a user runs it
(subprocesses, ``paddle.distributed.launch``); the overhead variants run in
one child process to keep this fast, and must all train the same thing.
"""

import json
import sys

import pytest
from patience import patience

from benchmarks import allreduce, common, dataloader, overhead, workers

SAME_TRAINING = ("bare", "ours", "ours-quiet", "paddlenlp", "hapi")


def test_overhead_variants_train_the_same_thing_and_the_report_renders():
    cmd = [sys.executable, "-m", "benchmarks.overhead", "--child", ",".join(overhead.VARIANTS),
           "--workload", "mlp", "--steps", "30", "--warmup", "5"]
    results = common.run_child(cmd, timeout=patience(240), all_results=True)
    by_variant = {r["variant"]: r for r in results}
    assert set(by_variant) == set(overhead.VARIANTS)
    for r in results:
        assert r["steps"] == 30 and r["steps_per_s"] > 0 and r["peak_rss_mb"] > 0, r
    # identical batches, optimizer and seed: identical parameters, bit for bit
    checksums = {v: by_variant[v]["param_checksum"] for v in SAME_TRAINING}
    losses = {v: by_variant[v]["final_loss"] for v in SAME_TRAINING}
    assert len(set(checksums.values())) == 1, checksums
    assert len(set(losses.values())) == 1, losses
    assert not by_variant["ours"]["paddlenlp_imported"], "import trainer must not import paddlenlp"
    assert "Rank0Logger" in by_variant["ours"]["callbacks"] and "Rank0Logger" not in by_variant["ours-quiet"]["callbacks"]
    assert len(by_variant["ours-all"]["callbacks"]) > len(by_variant["ours"]["callbacks"])

    for r in results:
        r["round"] = 0
    text = overhead.report({"mlp": results}, {"cores": 2, "paddle": "x"})
    assert "| bare |" in text and "| paddlenlp |" in text and "ratio to bare" in text
    assert "ours-quiet:" in text  # the verdict line against the target


def test_allreduce_runs_under_launch(tmp_path):
    out = tmp_path / "allreduce.json"
    assert allreduce.main(["--max-size", "16K", "--workloads", "mlp", "--sync-steps", "5", "--rounds", "1",
                           "--json", str(out), "--markdown", str(tmp_path / "allreduce.md")]) == 0
    res = json.loads(out.read_text())["result"]
    assert res["world_size"] == 2
    assert [r["bytes"] for r in res["collectives"]] == [1024, 4096, 16384]
    assert all(r["busbw_gbps"] > 0 for r in res["collectives"])
    sync = res["grad_sync"][0]
    assert sync["workload"] == "mlp" and sync["params"] == 128 * 64 + 64 + 64 * 2 + 2
    assert "busbw (GB/s)" in (tmp_path / "allreduce.md").read_text()


def test_dataloader_measures_each_backend_per_cpu_second(tmp_path):
    out = tmp_path / "dataloader.json"  # dali: tests/models/test_resnet_dali.py (a child costs a paddle import)
    assert dataloader.main(["--images", "64", "--sets", "textured", "--workers", "1", "--epochs", "1",
                            "--backends", "turbo", "--json", str(out), "--markdown", str(tmp_path / "d.md")]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    backends = ["pillow", "turbo"]
    assert [r["backend"] for r in rows] == backends and all(r["workers"] == 1 and r["set"] == "textured" for r in rows)
    for r in rows:  # both passes (workers started, workers kept) read every image; their CPU time is counted
        assert r["pipeline_images"] == r["first_pipeline_images"] == 64
        assert r["images_per_s"] > 0 and 0 < r["images_per_cpu_s"] < 1e5 and 0 < r["first_images_per_cpu_s"] < 1e5
        assert r["train_steps"] == 1  # 1 epoch x 2 steps, the first left out
        assert 0.0 <= r["data_wait_share"] <= 1.0
    assert rows[0]["cpu_s_ratio_to_pillow"] == 1.0
    evaluation = result["evaluation"]["textured"]
    assert set(evaluation["vs_pillow"]) == set(backends[1:]) and set(evaluation["images_per_cpu_s"]) == set(backends)
    assert all(v["mean_abs_diff"] <= 8 for v in evaluation["vs_pillow"].values())
    limits = result["decoder_alone"]["textured"]
    assert limits["decode_only_images_per_cpu_s"] > 0 and limits["reduced_scale_share"] == 0.0  # 500x375: none
    assert "| textured | 1 |" in (tmp_path / "d.md").read_text()


def test_workers_compares_kept_and_new_workers(tmp_path):
    out = tmp_path / "workers.json"
    assert workers.main(["--samples", "64", "--epochs", "2", "--repeats", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["persistent"] for r in rows] == [False, True]
    assert all(r["cpu_per_epoch"] > 0 and r["wall_per_epoch"] > 0 for r in rows)


@pytest.mark.parametrize("argv", [["--help"], ["nope"]])
def test_module_entry_point_lists_the_benchmarks(argv, capsys):
    from benchmarks.__main__ import main

    code = main(argv)
    assert code == (0 if argv == ["--help"] else 2)
    captured = capsys.readouterr()
    assert "overhead" in captured.out + captured.err


def test_memory_runs_each_layout_and_the_largest_model_search(tmp_path):
    from benchmarks import memory

    out = tmp_path / "memory.json"
    assert memory.main(["--modes", "dp,stage1+recompute", "--hidden", "32", "--layers", "2", "--heads", "2",
                        "--seq", "8", "--steps", "2", "--find-largest", "--start-layers", "1", "--max-layers", "1",
                        "--limit-mib", "4000", "--json", str(out), "--markdown", str(tmp_path / "memory.md")]) == 0
    res = json.loads(out.read_text())
    assert [r["mode"] for r in res["table"]] == ["dp", "stage1+recompute"]
    for row in res["table"]:
        assert len(row["ranks"]) == 2 and all(r["peak_rss_mb"] > r["before_rss_mb"] > 0 for r in row["ranks"])
    dp, s1 = res["table"]
    assert dp["ranks"][0]["layout"]["sharding_stage"] == 0 and s1["ranks"][0]["layout"]["sharding_stage"] == 1
    assert abs(dp["ranks"][0]["loss"] - s1["ranks"][0]["loss"]) < 1e-5  # the same training, laid out otherwise
    # a generous limit: the one size allowed trains, the search stops at its cap
    assert [r["layers"] for r in res["largest"]] == [1, 1] and all(r["capped"] for r in res["largest"])
    text = (tmp_path / "memory.md").read_text()
    assert "growth / dp" in text and "ratio to dp" in text
