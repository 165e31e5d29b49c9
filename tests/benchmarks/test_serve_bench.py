"""A seconds-long run of ``benchmarks/serve.py`` (the digits-sized MLP; ptrain serve in /v1, v2 JSON, v2 binary and
gRPC, and the hand-written peer over HTTP and gRPC, all real servers), so it keeps working. Not a measurement: no speed is asserted.

The benchmark runs in a child process: its gRPC clients load tritonclient's compiled protos, whose
``inference.DataType`` clashes with VisualDL's copy in one process, and a later test in the same pytest worker
that loads VisualDL (the docs' ``ptrain visualdl --help``) would fail on the duplicate symbol."""

import json
import os
import subprocess
import sys

from helpers import REPO
from patience import patience


def test_serve_benchmark_runs_every_protocol_and_the_peer(tmp_path):
    out = tmp_path / "serve.json"
    run = subprocess.run([sys.executable, "-m", "benchmarks", "serve", "--models", "digits", "--duration", "0.3",
                          "--slice", "0.15", "--rounds", "1", "--concurrency", "1,4", "--inline_models", "digits",
                          "--max_requests", "200", "--json", str(out), "--markdown", str(tmp_path / "serve.md")],
                         cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
                         timeout=patience(600))
    assert run.returncode == 0, run.stderr[-3000:]
    (model,) = json.loads(out.read_text())["result"]["models"]
    points = {(r["protocol"], r["concurrency"]): r for r in model["rows"]}
    assert set(points) == {(p, c) for p in ("v1", "v1-process", "v1-inline", "v2-json", "v2-binary", "grpc", "handwritten",
                                            "handwritten-grpc") for c in (1, 4)}
    for r in points.values():
        assert r["requests"] > 0 and r["errors"] == 0 and r["p99_ms"] >= r["p50_ms"] > 0
    assert points[("handwritten", 4)]["mean_batch"] == 1.0  # one request per model call
    text = (tmp_path / "serve.md").read_text()
    assert "| concurrency | protocol | requests/s | x hand-written | x hand-written gRPC |" in text
    assert "| 1 | v1-inline |" in text and "| 4 | handwritten-grpc |" in text
