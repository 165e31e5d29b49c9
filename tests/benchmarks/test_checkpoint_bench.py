"""Smoke run of ``benchmarks/checkpoint.py`` (seconds, not a measurement): both
children run with tiny settings and the report renders."""

import json
import sys

from patience import patience

from benchmarks import checkpoint, common


def test_checkpoint_benchmark_children_run_and_the_report_renders(tmp_path):
    # both stall modes and the resume child in one process: one paddle import (the parent runs one per process)
    cmd = [sys.executable, "-m", "benchmarks.checkpoint", "--child", "stall,resume", "--save-async", "0,1",
           "--params", "0.3", "--saves", "2", "--every", "3", "--batch", "4", "--out", str(tmp_path),
           "--positions", "10,500", "--epoch-samples", "64000", "--repeats", "1", "--replay-measure", "20"]
    *results, resume = common.run_child(cmd, timeout=patience(240), all_results=True)
    stall = []
    for res, mode in zip(results, ("sync", "async")):
        assert res["mode"] == mode and res["saves"] == [3, 6] and len(res["intervals"]) == 8, res["saves"]
        assert res["files"]["model.safetensors"] > 4 * 0.2e6 and res["load_s"] > 0 and res["bare_load_s"] > 0
        stall.append(json.loads(json.dumps(res)))
    assert set(resume["summary"]) == {"10", "500"}
    for r in stall:
        r["after_save"] = {int(k): v for k, v in r["after_save"].items()}
    text = checkpoint.report(stall, resume, {"cores": 2, "paddle": "x"}, "load")
    assert "| save_async=false |" in text and "| save_async=true |" in text
    assert "| 500 |" in text and "model.safetensors" in text
    assert "bare load of the same files" in text and "Load against the bare load, per interleaved pair" in text
