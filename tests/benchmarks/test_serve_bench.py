"""A seconds-long run of ``benchmarks/serve.py`` (the digits-sized MLP; ptrain serve in /v1, v2 JSON, v2 binary and
gRPC, and the hand-written peer, all real servers), so it keeps working. Not a measurement: no speed is asserted."""

import json

from benchmarks import serve


def test_serve_benchmark_runs_every_protocol_and_the_peer(tmp_path):
    out = tmp_path / "serve.json"
    assert serve.main(["--models", "digits", "--duration", "0.3", "--slice", "0.15", "--rounds", "1",
                       "--concurrency", "1,4", "--inline_models", "digits",
                       "--max_requests", "200", "--json", str(out), "--markdown", str(tmp_path / "serve.md")]) == 0
    (model,) = json.loads(out.read_text())["result"]["models"]
    points = {(r["protocol"], r["concurrency"]): r for r in model["rows"]}
    assert set(points) == {(p, c) for p in ("v1", "v1-process", "v1-inline", "v2-json", "v2-binary", "grpc", "handwritten")
                           for c in (1, 4)}
    for r in points.values():
        assert r["requests"] > 0 and r["errors"] == 0 and r["p99_ms"] >= r["p50_ms"] > 0
    assert points[("handwritten", 4)]["mean_batch"] == 1.0  # one request per model call
    text = (tmp_path / "serve.md").read_text()
    assert "| concurrency | protocol | requests/s | x hand-written |" in text and "| 1 | v1-inline |" in text
