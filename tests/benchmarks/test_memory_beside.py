"""``python -m benchmarks memory --against-paddlenlp`` runs PaddleNLP's own Trainer and ours on the same Llama
script (benchmarks/llama_script.py, only the Trainer import changed) and compares them; a tiny size here."""

import importlib.util
import json

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("paddlenlp") is None, reason="paddlenlp not installed")


def test_both_trainers_side_by_side_with_the_largest_model_search(tmp_path):
    from benchmarks import memory

    out = tmp_path / "beside.json"
    assert memory.main(["--against-paddlenlp", "--modes", "stage1+recompute", "--hidden", "32", "--intermediate", "64",
                        "--heads", "2", "--layers", "1", "--seq", "16", "--vocab", "100", "--steps", "3", "--repeat", "2",
                        "--find-largest", "--start-layers", "1", "--max-layers", "1", "--limit-mib", "8000",
                        "--json", str(out), "--markdown", str(tmp_path / "beside.md")]) == 0
    res = json.loads(out.read_text())
    (row,) = res["table"]
    for trainer in ("paddlenlp", "ours"):
        assert len(row[trainer]["ranks"]) == 2 and row[trainer]["peak_vm_mb"] > row[trainer]["peak_rss_mb"] > 0
        assert len(row[trainer]["losses"]) == 3
        # --repeat 2: both runs kept, the row's peak is their median
        peaks = [run["peak_rss_mb"] for run in row[trainer]["runs"]]
        assert len(peaks) == 2 and row[trainer]["peak_rss_mb"] == sum(peaks) / 2
    # the same training on both (PaddleNLP's order, clipping, schedule): the losses agree
    assert max(abs(x - y) for x, y in zip(row["paddlenlp"]["losses"], row["ours"]["losses"])) < 1e-5
    (search,) = res["largest"]
    assert search["ours"]["layers"] == search["paddlenlp"]["layers"] == 1 and search["ours"]["capped"]
    text = (tmp_path / "beside.md").read_text()
    assert "ours / PaddleNLP" in text and "median of 2 runs" in text
    assert "Probes (layers) of stage1+recompute: paddlenlp: 1 ✓; ours: 1 ✓." in text


def test_a_failed_table_launch_is_launched_again_and_named(monkeypatch):
    """A launch of the table that fails (a rank killed by a signal, a port taken) is launched again, at most 3 launches
    in all; the failure is logged and named in the report, and the third failure ends the benchmark."""
    import types

    from benchmarks import common, memory_beside

    a = types.SimpleNamespace(layers=1, steps=3)
    outcomes = [common.BenchmarkError("ours stage1 failed (-6): python -m paddle.distributed.launch ...\nlast lines"),
                [{"rank": 0}]]
    monkeypatch.setattr(memory_beside, "run", lambda *a, **k: (
        (_ for _ in ()).throw(outcomes.pop(0)) if isinstance(outcomes[0], Exception) else outcomes.pop(0)))
    lines, relaunched = [], []
    assert memory_beside.table_run(a, "ours", "stage1", None, lines.append, relaunched) == [{"rank": 0}]
    assert relaunched == ["ours stage1 failed (-6)"] and "launched again (1 of 2)" in lines[0]

    def always(*a, **k):
        raise common.BenchmarkError("ours stage1 failed (1): ...")

    monkeypatch.setattr(memory_beside, "run", always)
    with pytest.raises(common.BenchmarkError):
        memory_beside.table_run(a, "ours", "stage1", None, lines.append, [])
    assert len(lines) == 3  # 1 + the two relaunches of the failing one
