"""``ptrain serve`` under load: dynamic batching against one request per model call.

A closed-loop load generator on loopback: ``C`` client threads, each with its
own keep-alive HTTP connection, send one-instance ``POST /v1/predict``
requests back to back for ``--duration`` seconds (and at most
``--max_requests`` per point), against real ``ptrain serve`` processes
(``--max_batch_size 1`` and ``32``, the same ``--max_delay_ms``, one
predictor process with one math thread each; both up at once, the points
interleaved over ``--rounds`` and the median round reported, so a load spike
on a shared machine hits both settings alike). Per point: requests/s, p50 and p99
latency, and the mean rows per model call (``ptrain_serve_batch_size_sum /
_count`` of ``/metrics``, before and after).

The model is a random MLP exported with ``trainer.deploy.export``:
64 -> ``--hidden`` x ``--layers`` -> 10 (default 4096 x 3: 34 M parameters),
where one instance's compute outweighs an HTTP round trip. Its compute time at
batch 1 and 32 is measured in a predictor in this process first (the target:
p99 <= 2 x (max_delay + one batch's compute)).

    python -m benchmarks serve                          # ~4 min
    python -m benchmarks serve --hidden 256 --duration 1 --concurrency 1,4   # seconds
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List

import numpy as np

from benchmarks.common import fmt, load_line, machine_info, machine_line, markdown_table, write_outputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READY = re.compile(r"ready on http://127\.0\.0\.1:(\d+) ")


def export_mlp(path: str, hidden: int, layers: int) -> int:
    """Export a random 64 -> hidden x layers -> 10 MLP to ``path``; return its parameter count."""
    import paddle
    from paddle.static import InputSpec

    from trainer.deploy.export import export_model

    paddle.seed(0)
    mods, width = [], 64
    for _ in range(layers):
        mods += [paddle.nn.Linear(width, hidden), paddle.nn.ReLU()]
        width = hidden
    model = paddle.nn.Sequential(*mods, paddle.nn.Linear(width, 10))
    export_model(model, path, input_spec=[InputSpec([None, 64], "float32", "x")])
    return int(sum(int(np.prod(p.shape)) for p in model.parameters()))


def compute_ms(path: str, rows: int, repeats: int = 20) -> float:
    """Median ms of one paddle.inference call on ``rows`` rows (one math thread, as the server's worker)."""
    from trainer.deploy.predictor import create_predictor, run_predictor

    predictor = create_predictor(path, threads=1)
    x = np.random.RandomState(0).randn(rows, 64).astype("float32")
    run_predictor(predictor, [x])
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        run_predictor(predictor, [x])
        times.append((time.perf_counter() - t) * 1000)
    return float(np.median(times))


class ServerProcess:
    def __init__(self, model_dir: str, max_batch_size: int, max_delay_ms: float):
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-m", "trainer.cli", "serve", model_dir, "--port", "0",
                                      "--max_batch_size", str(max_batch_size), "--max_delay_ms", str(max_delay_ms),
                                      "--max_queue", "4096"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"ptrain serve exited with {self.proc.returncode} before it was ready")
            m = READY.search(line)
            if m:
                self.port = int(m.group(1))
                return
        self.stop()
        raise RuntimeError("ptrain serve was not ready within 300 s")

    def batch_stats(self) -> tuple:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        get = lambda name: float(re.search(rf"^{name} (\S+)", text, re.M).group(1))
        return get("ptrain_serve_batch_size_count"), get("ptrain_serve_batch_size_sum")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def closed_loop(port: int, concurrency: int, duration: float, max_requests: int) -> Dict[str, float]:
    """``concurrency`` clients, each sending its next request when the last is answered."""
    body = json.dumps({"inputs": np.random.RandomState(1).randn(1, 64).astype("float32").tolist()}).encode()
    latencies: List[List[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    budget = threading.Semaphore(max_requests)
    start_at = time.monotonic() + 0.2
    stop_at = start_at + duration

    def client(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.monotonic() < start_at:
            time.sleep(0.001)
        while time.monotonic() < stop_at and budget.acquire(blocking=False):
            t = time.perf_counter()
            try:
                conn.request("POST", "/v1/predict", body=body, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                ok = r.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            if ok:
                latencies[i].append((time.perf_counter() - t) * 1000)
            else:
                errors[i] += 1
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start_at
    flat = np.array([x for per in latencies for x in per]) if any(latencies) else np.array([0.0])
    return {"requests": int(sum(len(p) for p in latencies)), "errors": int(sum(errors)),
            "rps": sum(len(p) for p in latencies) / elapsed, "p50_ms": float(np.percentile(flat, 50)),
            "p99_ms": float(np.percentile(flat, 99)), "seconds": elapsed}


def run(args) -> dict:
    workdir = tempfile.mkdtemp(prefix="ptrain-serve-bench-")
    path = os.path.join(workdir, "inference")
    params = export_mlp(path, args.hidden, args.layers)
    one, full = compute_ms(path, 1), compute_ms(path, max(args.batch_sizes))
    servers = {b: ServerProcess(path, b, args.max_delay_ms) for b in args.batch_sizes}  # both up, idle between
    points: Dict[tuple, List[dict]] = {}
    try:
        for server in servers.values():
            closed_loop(server.port, 2, 1.0, 50)  # warm the connections and the event loop
        for round_ in range(args.rounds):  # interleaved: a load spike on the machine hits both settings alike
            for c in args.concurrency:
                order = args.batch_sizes if round_ % 2 == 0 else list(reversed(args.batch_sizes))
                for batch in order:
                    server = servers[batch]
                    before = server.batch_stats()
                    point = closed_loop(server.port, c, args.duration, args.max_requests)
                    after = server.batch_stats()
                    calls = after[0] - before[0]
                    point.update(max_batch_size=batch, concurrency=c, round=round_,
                                 mean_batch=(after[1] - before[1]) / calls if calls else 0.0)
                    points.setdefault((batch, c), []).append(point)
                    print(f"round {round_} max_batch_size {batch:>3} concurrency {c:>3}: {point['rps']:.0f} req/s, "
                          f"p50 {point['p50_ms']:.1f} ms, p99 {point['p99_ms']:.1f} ms, mean batch "
                          f"{point['mean_batch']:.1f}", file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            server.stop()
    rows = [_median_point(v) for v in points.values()]
    return {"params": params, "compute_ms_1": one, "compute_ms_full": full, "rows": rows,
            "max_delay_ms": args.max_delay_ms, "max_batch": max(args.batch_sizes)}


def _median_point(points: List[dict]) -> dict:
    """The round with the median requests/s (its latencies with it), plus every round's requests/s."""
    ranked = sorted(points, key=lambda p: p["rps"])
    mid = dict(ranked[len(ranked) // 2])
    mid["rps_rounds"] = [round(p["rps"], 1) for p in points]
    mid["errors"] = sum(p["errors"] for p in points)
    return mid


def report(result: dict, info: dict) -> str:
    by = {(r["max_batch_size"], r["concurrency"]): r for r in result["rows"]}
    table = markdown_table(["concurrency", "max_batch_size", "requests/s", "p50 (ms)", "p99 (ms)", "mean batch",
                            "requests/s by round", "errors"],
                           [[r["concurrency"], r["max_batch_size"], fmt(r["rps"], 0), fmt(r["p50_ms"], 1),
                             fmt(r["p99_ms"], 1), fmt(r["mean_batch"], 1),
                             " / ".join(f"{x:.0f}" for x in r.get("rps_rounds", [r["rps"]])), r["errors"]]
                            for r in sorted(result["rows"], key=lambda r: (r["concurrency"], r["max_batch_size"]))])
    lines = [f"MLP of {result['params'] / 1e6:.1f} M parameters; paddle.inference, one thread: "
             f"{result['compute_ms_1']:.1f} ms at batch 1, {result['compute_ms_full']:.1f} ms at batch "
             f"{result['max_batch']} ({result['compute_ms_full'] / result['max_batch']:.2f} ms per instance); "
             f"--max_delay_ms {result['max_delay_ms']:g}.", "", table, ""]
    big = result["max_batch"]
    bound = 2 * (result["max_delay_ms"] + result["compute_ms_full"])
    for c in sorted({r["concurrency"] for r in result["rows"]}):
        if (1, c) in by and (big, c) in by:
            a, b = by[(1, c)], by[(big, c)]
            lines.append(f"- concurrency {c}: dynamic batching {b['rps'] / max(a['rps'], 1e-9):.2f}x the requests/s "
                         f"of batch 1; p99 {b['p99_ms']:.1f} ms against the bound 2 x (max_delay + one batch) = "
                         f"{bound:.1f} ms ({'within' if b['p99_ms'] <= bound else 'over'})")
    lines += ["", machine_line(info), load_line()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--concurrency", default="1,8,16,32", help="comma-separated client counts")
    p.add_argument("--batch_sizes", default="1,32", help="comma-separated --max_batch_size values")
    p.add_argument("--max_delay_ms", type=float, default=5.0)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per point")
    p.add_argument("--rounds", type=int, default=3, help="interleaved repeats; the median round is reported")
    p.add_argument("--max_requests", type=int, default=20000, help="at most this many requests per point")
    p.add_argument("--markdown", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    args.batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    info = machine_info()
    result = run(args)
    text = report(result, info)
    print(text)
    write_outputs(text, {"result": result, "machine": info}, args.markdown, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
