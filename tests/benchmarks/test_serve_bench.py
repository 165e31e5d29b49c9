"""A seconds-long run of ``benchmarks/serve.py`` (a tiny MLP, two real servers), so it keeps working.
Not a measurement: no speed is asserted."""

import json

from benchmarks import serve


def test_serve_benchmark_runs_both_settings_and_reports(tmp_path):
    out = tmp_path / "serve.json"
    assert serve.main(["--hidden", "32", "--layers", "1", "--duration", "0.3", "--rounds", "1",
                       "--concurrency", "1,4", "--max_requests", "200", "--json", str(out),
                       "--markdown", str(tmp_path / "serve.md")]) == 0
    result = json.loads(out.read_text())["result"]
    points = {(r["max_batch_size"], r["concurrency"]): r for r in result["rows"]}
    assert set(points) == {(1, 1), (1, 4), (32, 1), (32, 4)}
    for r in points.values():
        assert r["requests"] > 0 and r["errors"] == 0 and r["p99_ms"] >= r["p50_ms"] > 0
    assert points[(1, 4)]["mean_batch"] == 1.0  # --max_batch_size 1 never batches
    text = (tmp_path / "serve.md").read_text()
    assert "| concurrency | max_batch_size | requests/s |" in text and "dynamic batching" in text
