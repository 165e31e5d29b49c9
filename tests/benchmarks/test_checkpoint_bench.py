"""Smoke run of ``benchmarks/checkpoint.py`` (seconds, not a measurement): both
children run with tiny settings and the report renders."""

import json
import sys

import pytest

from patience import patience

from benchmarks import checkpoint, common, save_stall


def test_checkpoint_benchmark_children_run_and_the_report_renders(tmp_path):
    # the save cycle and the resume child in one process: one paddle import (the parent runs one per process)
    cmd = [sys.executable, "-m", "benchmarks.checkpoint", "--child", "stall,resume",
           "--params", "0.3", "--rounds", "2", "--every", "3", "--batch", "4", "--out", str(tmp_path),
           "--positions", "10,500", "--epoch-samples", "64000", "--repeats", "1", "--replay-measure", "20"]
    stall, resume = common.run_child(cmd, timeout=patience(240), all_results=True)
    modes = [p["mode"] for p in stall["periods"]]
    assert modes == ["none", "sync", "async", "none", "async", "sync"], modes  # the order alternates by round
    assert all(len(p["intervals"]) == 3 for p in stall["periods"])
    summary = stall["summary"]["modes"]
    assert summary["sync"]["n"] == 2 and summary["async"]["n"] == 2
    assert stall["files"]["model.safetensors"] > 4 * 0.2e6 and stall["load_s"] > 0 and stall["bare_load_s"] > 0
    assert set(resume["summary"]) == {"10", "500"}
    stall = json.loads(json.dumps(stall))
    stall["load"], stall["busy"] = "no burners (load average 1.0 -> 1.0)", 0
    text = checkpoint.report([stall], resume, {"cores": 2, "paddle": "x"}, "load")
    assert "| no burners (load average 1.0 -> 1.0) | sync |" in text and "| async |" in text
    assert "lost, async / sync" in text
    assert "| 500 |" in text and "model.safetensors" in text
    assert "bare load of the same files" in text and "Load against the bare load, per interleaved pair" in text


def test_the_writer_comparison_runs_and_prints_its_table(capsys, tmp_path):
    assert save_stall.main(["--writers", "buffered:1,direct:2", "--mib", "6", "--rounds", "1", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| writer | writer thread's CPU per file (ms) |" in out
    assert "\n| buffered 1 MiB |" in out and "\n| direct 2 MiB |" in out


def test_a_writer_variant_that_is_not_one_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        save_stall.main(["--writers", "direct:0"])
    assert exit_.value.code == 2 and "--writers: 'direct:0' is not buffered:MIB or direct:MIB" in capsys.readouterr().err
