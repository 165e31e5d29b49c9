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
