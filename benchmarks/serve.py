"""``ptrain serve`` under load: /v1 and the Open Inference Protocol (v2 JSON, v2 binary, gRPC) against a hand-written server.

A closed-loop load generator on loopback: ``C`` client threads, each with its
own keep-alive HTTP connection, send one-instance requests back to back for
``--duration`` seconds (and at most ``--max_requests`` per point). Targets,
all up at once and interleaved over ``--rounds`` (the median round is
reported, so a load spike on a shared machine hits every target alike):

- ``ptrain serve`` with its defaults (``--max_batch_size 32``, ``--max_delay_ms``;
  one predictor process with one math thread, and for a model whose call is
  under ``--inline_max_ms``, the digits model, lone requests in the server
  process), spoken to in four protocols: ``/v1/predict`` JSON, ``/v2/models/NAME/infer`` JSON,
  v2 with binary tensors (the request's and the answer's tensors as raw
  bytes after the JSON header), and v2 over gRPC (``--grpc_port``; ``ModelInfer``
  with raw tensor bytes, as tritonclient's gRPC client sends; one channel per
  client; where grpcio and tritonclient are installed: the serve extra);
- for ``--process_models`` (default digits), ``ptrain serve --workers 1`` too
  (``v1-process``: every request through the predictor process);
- for ``--inline_models`` (default none), ``ptrain serve --inline_max_ms 1000``
  too (``v1-inline``: lone requests in the server process whatever the model's call);
- the hand-written peer (``benchmarks/handwritten_server.py``): Starlette +
  ``paddle.inference`` in the handler under uvicorn, one request per model call;
  where gRPC runs, the same process also answers ``ModelInfer`` by hand on
  ``grpc.aio`` (``handwritten-grpc``, the peer of the ``grpc`` row: column
  "x hand-written gRPC").

Within a point the targets take turns of ``--slice`` seconds until each has had
``--duration`` (so a load spike of a shared machine falls on all of them).

Per point: requests/s, p50 and p99 latency, the CPU time the server's processes
(the server and its predictor processes) spent per request (a figure a busy
machine does not inflate, unlike the clock's), and for ``ptrain serve`` the
mean rows per model call (``ptrain_serve_batch_size_sum / _count`` of ``/metrics``).
Models (``--models``): ``digits``, an MLP the size of the digits task's
(64 -> 32 x 2 -> 10), and ``mlp``, 64 -> ``--hidden`` x ``--layers`` -> 10
(default 4096 x 3: 34 M parameters), random weights exported with
``trainer.deploy.export``.

    python -m benchmarks serve                          # ~10 min
    python -m benchmarks serve --models digits --duration 1 --concurrency 1,4 --rounds 1   # seconds
"""

from __future__ import annotations

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
from typing import Dict, List, Tuple

import numpy as np

from benchmarks import common
from benchmarks.common import fmt, free_port, load_line, machine_info, machine_line, markdown_table, write_outputs

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
    """A ``ptrain serve`` (``kind`` ``ptrain``) or hand-written (``handwritten``) server on a free port."""

    def __init__(self, kind: str, model_dir: str, max_batch_size: int = 32, max_delay_ms: float = 5.0,
                 workers=None, extra=()):
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.kind, self.grpc_port = kind, 0
        if kind != "handwritten":
            cmd = [sys.executable, "-m", "trainer.cli", "serve", model_dir, "--port", "0", "--model_name", "m",
                   "--max_batch_size", str(max_batch_size), "--max_delay_ms", str(max_delay_ms), "--max_queue", "4096"]
            cmd += ([] if workers is None else ["--workers", str(workers)]) + list(extra)
            if kind == "ptrain" and _has_grpc():  # the Open Inference Protocol over gRPC beside HTTP, same batcher
                self.grpc_port = free_port()
                cmd += ["--grpc_port", str(self.grpc_port)]
        else:
            cmd = [sys.executable, "-m", "benchmarks.handwritten_server", model_dir, "0"]
            if _has_grpc():  # its gRPC peer: ModelInfer by hand on the same predictor
                self.grpc_port = free_port()
                cmd.append(str(self.grpc_port))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                     cwd=ROOT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"{kind} server exited with {self.proc.returncode} before it was ready")
            m = READY.search(line)
            if m:
                self.port, self.ready_line = int(m.group(1)), line
                return
        self.stop()
        raise RuntimeError(f"{kind} server was not ready within 300 s")

    def cpu_seconds(self) -> float:
        """CPU seconds the server and its predictor processes have spent (user + system)."""
        import psutil

        procs = [psutil.Process(self.proc.pid)]
        procs += procs[0].children(recursive=True)
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    def batch_stats(self) -> tuple:
        if self.kind == "handwritten":
            return 0.0, 0.0
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        get = lambda name: float(re.search(rf"^{name} (\S+)", text, re.M).group(1))  # noqa: E731
        return get("ptrain_serve_batch_size_count"), get("ptrain_serve_batch_size_sum")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def _has_grpc() -> bool:
    """Whether ``ptrain serve --grpc_port`` can run here (grpcio and tritonclient's messages: the serve extra)."""
    from trainer.deploy.grpc_app import grpc_modules
    from trainer.errors import ConfigError

    try:
        grpc_modules()
    except ConfigError:
        return False
    return True


def grpc_closed_loop(port: int, concurrency: int, duration: float, max_requests: int) -> Dict[str, float]:
    """:func:`closed_loop` over gRPC: ``ModelInfer`` with the tensor as raw bytes (``raw_input_contents``, what
    tritonclient's gRPC client sends), one channel per client."""
    from trainer.deploy.grpc_app import grpc_modules

    grpc, service_pb2, service_pb2_grpc = grpc_modules()
    x = np.random.RandomState(1).randn(1, 64).astype("<f4")
    request = service_pb2.ModelInferRequest(model_name="m", inputs=[service_pb2.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=[1, 64])], raw_input_contents=[x.tobytes()])

    def call(state):
        if state is None:
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            state = (channel, service_pb2_grpc.GRPCInferenceServiceStub(channel))
        try:
            state[1].ModelInfer(request, timeout=60)
            return state, True
        except grpc.RpcError:
            return state, False

    return _drive(call, lambda state: state and state[0].close(), concurrency, duration, max_requests)


def request_of(protocol: str, x: np.ndarray) -> Tuple[str, bytes, Dict[str, str]]:
    """``(path, body, headers)`` of a one-instance request in ``protocol``."""
    if protocol in ("v1", "v1-inline"):
        return "/v1/predict", json.dumps({"inputs": x.tolist()}).encode(), {"Content-Type": "application/json"}
    if protocol == "handwritten":
        return "/predict", json.dumps({"inputs": x.tolist()}).encode(), {"Content-Type": "application/json"}
    tensor = {"name": "x", "shape": list(x.shape), "datatype": "FP32"}
    if protocol == "v2-json":
        body = {"inputs": [dict(tensor, data=x.ravel().tolist())]}
        return "/v2/models/m/infer", json.dumps(body).encode(), {"Content-Type": "application/json"}
    raw = x.astype("<f4").tobytes()
    head = json.dumps({"inputs": [dict(tensor, parameters={"binary_data_size": len(raw)})],
                       "parameters": {"binary_data_output": True}}).encode()
    return "/v2/models/m/infer", head + raw, {"Content-Type": "application/octet-stream",
                                              "Inference-Header-Content-Length": str(len(head))}


def closed_loop(port: int, protocol: str, concurrency: int, duration: float, max_requests: int) -> Dict[str, float]:
    """``concurrency`` clients, each sending its next request when the last is answered."""
    if protocol in GRPC:
        return grpc_closed_loop(port, concurrency, duration, max_requests)
    path, body, headers = request_of(protocol, np.random.RandomState(1).randn(1, 64).astype("float32"))

    def call(conn):
        conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            conn.request("POST", path, body=body, headers=headers)
            r = conn.getresponse()
            r.read()
            return conn, r.status == 200
        except (OSError, http.client.HTTPException):
            conn.close()
            return None, False

    return _drive(call, lambda conn: conn and conn.close(), concurrency, duration, max_requests)


def _drive(call, close, concurrency: int, duration: float, max_requests: int) -> Dict[str, float]:
    """Run ``concurrency`` client threads, each ``state, ok = call(state)`` back to back for ``duration`` s (at most
    ``max_requests`` in all), then ``close(state)``; requests/s, p50 and p99 of the answered ones."""
    latencies: List[List[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    budget = threading.Semaphore(max_requests)
    start_at = time.monotonic() + 0.2
    stop_at = start_at + duration

    def client(i: int) -> None:
        state = None
        while time.monotonic() < start_at:
            time.sleep(0.001)
        while time.monotonic() < stop_at and budget.acquire(blocking=False):
            t = time.perf_counter()
            state, ok = call(state)
            if ok:
                latencies[i].append((time.perf_counter() - t) * 1000)
            else:
                errors[i] += 1
        close(state)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start_at
    flat = np.array([x for per in latencies for x in per]) if any(latencies) else np.array([0.0])
    return {"requests": int(sum(len(p) for p in latencies)), "errors": int(sum(errors)),
            "rps": sum(len(p) for p in latencies) / elapsed, "p50_ms": float(np.percentile(flat, 50)),
            "p99_ms": float(np.percentile(flat, 99)), "seconds": elapsed, "latencies": flat.tolist()}


def sliced(servers: dict, order, concurrency: int, args) -> Dict[str, dict]:
    """Every target of ``order`` for ``args.duration`` seconds in all, in turns of ``args.slice`` seconds: a load
    spike of a shared machine then falls on every target alike, not on whichever ran at that moment."""
    runs: Dict[str, List[dict]] = {protocol: [] for _, protocol in order}
    calls: Dict[str, list] = {protocol: [0.0, 0.0] for _, protocol in order}
    cpu: Dict[str, float] = {protocol: 0.0 for _, protocol in order}
    for _ in range(max(1, round(args.duration / args.slice))):
        for kind, protocol in order:
            before, cpu_before = servers[kind].batch_stats(), servers[kind].cpu_seconds()
            port = servers[kind].grpc_port if protocol in GRPC else servers[kind].port
            runs[protocol].append(closed_loop(port, protocol, concurrency, args.slice, args.max_requests))
            after = servers[kind].batch_stats()
            cpu[protocol] += servers[kind].cpu_seconds() - cpu_before  # with the /metrics reads: a few ms a slice
            calls[protocol][0] += after[0] - before[0]
            calls[protocol][1] += after[1] - before[1]
    points = {}
    for protocol, parts in runs.items():
        flat = np.array([x for p in parts for x in p["latencies"]] or [0.0])
        seconds = sum(p["seconds"] for p in parts)
        requests = sum(p["requests"] for p in parts)
        points[protocol] = {"requests": requests, "errors": sum(p["errors"] for p in parts), "seconds": seconds,
                            "rps": requests / seconds, "p50_ms": float(np.percentile(flat, 50)),
                            "p99_ms": float(np.percentile(flat, 99)),
                            "cpu_ms": 1000 * cpu[protocol] / requests if requests else 0.0,
                            "mean_batch": calls[protocol][1] / calls[protocol][0] if calls[protocol][0] else 1.0}
    return points


TARGETS = (("ptrain", "v1"), ("ptrain", "v2-json"), ("ptrain", "v2-binary"), ("ptrain", "grpc"),
           ("handwritten", "handwritten"), ("handwritten", "handwritten-grpc"))
GRPC = ("grpc", "handwritten-grpc")
PROCESS = ("process", "v1-process")  # ptrain serve --workers 1: the model in a predictor process (--process_models)
INLINE = ("inline", "v1-inline")  # ptrain serve --inline_max_ms 1000: lone requests in the server process (--inline_models)
MODELS = {"digits": (32, 2)}


def run_model(model: str, args, workdir: str) -> dict:
    hidden, layers = MODELS.get(model, (args.hidden, args.layers))
    path = os.path.join(workdir, model, "inference")
    params = export_mlp(path, hidden, layers)
    one, full = compute_ms(path, 1), compute_ms(path, args.max_batch_size)
    servers = {"ptrain": ServerProcess("ptrain", path, args.max_batch_size, args.max_delay_ms),
               "handwritten": ServerProcess("handwritten", path)}
    targets = TARGETS if servers["ptrain"].grpc_port else tuple(t for t in TARGETS if t[1] not in GRPC)
    if model in args.process_models:
        servers["process"] = ServerProcess("process", path, args.max_batch_size, args.max_delay_ms, workers=1)
        targets = targets[:1] + (PROCESS,) + targets[1:]
    if model in args.inline_models:
        servers["inline"] = ServerProcess("inline", path, args.max_batch_size, args.max_delay_ms,
                                          extra=("--inline_max_ms", "1000"))
        targets = targets[:1] + (INLINE,) + targets[1:]
    points: Dict[tuple, List[dict]] = {}
    try:
        for kind, protocol in targets:  # warm the connections and the event loop
            closed_loop(servers[kind].grpc_port if protocol in GRPC else servers[kind].port, protocol, 2, 0.5, 50)
        for round_ in range(args.rounds):  # interleaved: a load spike on the machine hits every target alike
            for c in args.concurrency:
                order = targets if round_ % 2 == 0 else tuple(reversed(targets))
                for protocol, point in sliced(servers, order, c, args).items():
                    kind = dict((p, k) for k, p in targets)[protocol]
                    point.update(model=model, server=kind, protocol=protocol, concurrency=c, round=round_)
                    points.setdefault((protocol, c), []).append(point)
                    print(f"{model} round {round_} {protocol:>11} concurrency {c:>3}: {point['rps']:.0f} req/s, "
                          f"p50 {point['p50_ms']:.1f} ms, p99 {point['p99_ms']:.1f} ms, CPU "
                          f"{point['cpu_ms']:.2f} ms/request, mean batch "
                          f"{point['mean_batch']:.1f}", file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            server.stop()
    where = ("lone requests in the server process, the rest batched in a predictor process"
             if "in the server process" in servers["ptrain"].ready_line else "in a predictor process")
    return {"model": model, "params": params, "compute_ms_1": one, "compute_ms_full": full,
            "placement": f"ptrain serve's defaults run it {where}",
            "rows": [_median_point(v) for v in points.values()]}


def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="ptrain-serve-bench-", ignore_cleanup_errors=True) as workdir:
        return {"models": [run_model(m, args, workdir) for m in args.models], "max_delay_ms": args.max_delay_ms,
                "max_batch": args.max_batch_size}


def _median_point(points: List[dict]) -> dict:
    """The round with the median requests/s (its latencies with it), plus every round's requests/s."""
    ranked = sorted(points, key=lambda p: p["rps"])
    mid = dict(ranked[len(ranked) // 2])
    mid["rps_rounds"] = [round(p["rps"], 1) for p in points]
    mid["errors"] = sum(p["errors"] for p in points)
    return mid


def report(result: dict, info: dict) -> str:
    lines = []
    for m in result["models"]:
        by = {(r["protocol"], r["concurrency"]): r for r in m["rows"]}
        rows = []
        names = [t[1] for t in TARGETS[:1] + (PROCESS, INLINE) + TARGETS[1:]]
        for r in sorted(m["rows"], key=lambda r: (r["concurrency"], names.index(r["protocol"]))):
            peer = by.get(("handwritten", r["concurrency"]))
            grpc_peer = by.get(("handwritten-grpc", r["concurrency"])) if r["protocol"] == "grpc" else None
            rows.append([r["concurrency"], r["protocol"], fmt(r["rps"], 0),
                         fmt(r["rps"] / peer["rps"], 2) if peer and peer["rps"] else "",
                         fmt(r["rps"] / grpc_peer["rps"], 2) if grpc_peer and grpc_peer["rps"] else "",
                         fmt(r["p50_ms"], 1), fmt(r["p99_ms"], 1), fmt(r["cpu_ms"], 2),
                         fmt(peer["cpu_ms"] / r["cpu_ms"], 2) if peer and r["cpu_ms"] else "", fmt(r["mean_batch"], 1),
                         " / ".join(f"{x:.0f}" for x in r.get("rps_rounds", [r["rps"]])), r["errors"]])
        table = markdown_table(["concurrency", "protocol", "requests/s", "x hand-written", "x hand-written gRPC",
                                "p50 (ms)", "p99 (ms)",
                                "server CPU ms/request", "x hand-written (CPU)", "mean batch", "requests/s by round",
                                "errors"], rows)
        lines += [f"**{m['model']}**: MLP of {m['params'] / 1e6:.2f} M parameters; paddle.inference, one thread: "
                  f"{m['compute_ms_1']:.2f} ms at batch 1, {m['compute_ms_full']:.2f} ms at batch "
                  f"{result['max_batch']}; ptrain serve --max_batch_size {result['max_batch']} --max_delay_ms "
                  f"{result['max_delay_ms']:g}" + (f"; {m['placement']}" if m.get("placement") else "") + ".", "",
                  table, ""]
    lines += [machine_line(info), load_line()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = common.Parser(prog="python -m benchmarks serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--models", default="digits,mlp", help="comma-separated: digits (64-32-32-10), mlp (--hidden)")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts")
    p.add_argument("--max_batch_size", type=int, default=32)
    p.add_argument("--process_models", default="digits",
                   help="comma-separated models also served with --workers 1 (the model in a predictor process)")
    p.add_argument("--inline_models", default="",
                   help="comma-separated models also served with --inline_max_ms 1000 (lone requests in the server "
                        "process however long the model's call)")
    p.add_argument("--max_delay_ms", type=float, default=5.0)
    p.add_argument("--duration", type=float, default=4.0, help="seconds per point (in turns of --slice)")
    p.add_argument("--slice", type=float, default=0.5, help="seconds per turn of one target before the next")
    p.add_argument("--rounds", type=int, default=3, help="interleaved repeats; the median round is reported")
    p.add_argument("--max_requests", type=int, default=20000, help="at most this many requests per point")
    p.add_argument("--markdown", type=common.output_file, default=None)
    p.add_argument("--json", type=common.output_file, default=None)
    args = p.parse_args(argv)
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    args.models = [x for x in args.models.split(",") if x]
    args.process_models = [x for x in args.process_models.split(",") if x]
    args.inline_models = [x for x in args.inline_models.split(",") if x]
    info = machine_info()
    result = run(args)
    text = report(result, info)
    print(text)
    write_outputs(text, {"result": result, "machine": info}, args.markdown, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
