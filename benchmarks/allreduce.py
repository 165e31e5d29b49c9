"""All-reduce time and bus bandwidth across the processes of a
``paddle.distributed.launch`` run, and the share of a training step spent in
gradient synchronization.

The parent starts ``python -m paddle.distributed.launch --nproc_per_node N``
on this file (gloo on CPU, NCCL on GPUs: whatever paddle picks for the
device); rank 0 writes the measurements to a JSON file the parent reads.

Collectives: for each buffer size (float32, 1 KiB to 256 MiB by factors of 4)
a few warm-up calls, then 5 timed blocks of back-to-back ``all_reduce`` calls,
each after a barrier; a block's time per call is the slowest rank's, and the
table shows the median block (and the fastest). As nccl-tests
define them: algorithm bandwidth = bytes / time, bus bandwidth = algbw x
2(n-1)/n (what each link carries in a ring all-reduce; compare it with the
link's rate).

Gradient sync: the MLP and the ERNIE-style model of ``benchmarks.workloads`` in
``paddle.DataParallel``, a hand-written loop on each rank's shard. Blocks of
steps with synchronization alternate with blocks inside ``model.no_sync()``
(the same step without the gradient all-reduce); sync cost = step time with
minus step time without, and its share of the step. Beside it, the time of
one all-reduce of a buffer as large as all the gradients (what the sync moves,
without DataParallel's bucketing), and a third block, the trainer's deferred
average (``trainer.parallel.grad_sync``: the backward under ``no_sync``, then
one fused all-reduce, as under recompute and ``auto_find_batch_size``): its
wall and CPU time per step as a ratio to DataParallel's own (in the last
backward). ``--recompute`` runs every block with the model's blocks under the
trainer's non-reentrant recompute (the MLP's ``fc1``, ERNIE's encoder layers),
or PaddleNLP's Llama under its own (``--workloads llama``), where DataParallel's
own sync works too: the before/after of recompute under data parallel.

Each worker runs with ``OMP_NUM_THREADS`` = cores / processes (at least 1) so
the processes do not fight over cores.

Run::

    python -m benchmarks allreduce                       # 2 processes, a minute or two
    python -m benchmarks allreduce --nproc 4 --max-size 64M --workloads mlp
    python -m benchmarks allreduce --max-size 1K --recompute   # gradient sync under recompute
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script by paddle.distributed.launch
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402

BLOCKS = 5  # timed blocks per size; the table shows the median block
NOMINAL_LINKS = ("nominal per-direction link rates to compare bus bandwidth with: PCIe 4.0 x16 ≈ 32 GB/s, "
                 "PCIe 5.0 x16 ≈ 64 GB/s, NVLink 3 (A100) 300 GB/s, NVLink 4 (H100) 450 GB/s, "
                 "InfiniBand HDR 200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s, 100 GbE = 12.5 GB/s")


def parse_size(text: str) -> int:
    text = text.strip().upper().rstrip("B").rstrip("I")
    scale = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def sizes_between(lo: int, hi: int, factor: int = 4):
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def iters_for(size: int, budget_s: float = 1.5, est_gbps: float = 0.5) -> int:
    """Enough calls for a stable mean, few for the big buffers (assumes ~0.5 GB/s to start with)."""
    est = 2e-4 + size / (est_gbps * 1e9)
    return int(max(3, min(200, budget_s / est)))


# =============================================================================
# worker (one per rank, under paddle.distributed.launch)
# =============================================================================
def _slowest(seconds: float) -> float:
    import paddle
    import paddle.distributed as dist

    t = paddle.to_tensor([seconds], dtype="float64")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.numpy()[0])


def bench_collectives(sizes, world: int) -> list:
    import paddle
    import paddle.distributed as dist

    rows = []
    first = paddle.ones([256], dtype="float32")
    for _ in range(20):  # the first calls set up gloo's connections: keep them out of the table
        dist.all_reduce(first)
    for size in sizes:
        buf = paddle.ones([size // 4], dtype="float32")
        iters = iters_for(size)
        for _ in range(2 if size > 2 ** 24 else 5):
            dist.all_reduce(buf)
        blocks = min(BLOCKS, iters)
        per_block = max(1, iters // blocks)
        times = []
        for _ in range(blocks):  # the median block: robust to other work on the machine
            dist.barrier()
            start = time.perf_counter()
            for _ in range(per_block):
                dist.all_reduce(buf)
            times.append(_slowest((time.perf_counter() - start) / per_block))
        per_call = common.median(times)
        algbw = size / per_call / 1e9
        rows.append({"bytes": size, "iters": blocks * per_block, "time_us": per_call * 1e6,
                     "min_time_us": min(times) * 1e6, "algbw_gbps": algbw,
                     "busbw_gbps": algbw * 2 * (world - 1) / world})
        del buf
    return rows


def _time_steps(model, loader_iter, optimizer, loss_fn, steps: int, sync: str) -> tuple:
    """(wall s, CPU s of this process) per step; ``sync``: ``in_backward`` (DataParallel's reducer), ``deferred``
    (no_sync, then one fused all-reduce: the trainer's GradSync) or ``none`` (no_sync, no all-reduce)."""
    from trainer.parallel.grad_sync import GradSync

    grads = GradSync(model, deferred=sync == "deferred")
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        data, label = next(loader_iter)
        with (grads.context(last=True) if sync != "none" else model.no_sync()):
            loss = loss_fn(model(data), label)
            loss.backward()
        if sync != "none":
            grads.finish()
        optimizer.step()
        optimizer.clear_grad()
    float(loss)  # wait for the last step (a no-op on CPU, a sync on GPU)
    return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


#: the blocks ``--recompute`` runs under the trainer's recompute (``recompute_modules``), per workload; None: the
#: model's own switch (llama: PaddleNLP's non-reentrant recompute, which DataParallel's reducer follows)
RECOMPUTED = {"mlp": ["fc1"], "ernie": ["TransformerEncoderLayer"], "llama": None}


def bench_grad_sync(workload: str, steps: int, rounds: int, seed: int, recompute: bool = False) -> dict:
    import itertools

    import paddle
    import paddle.distributed as dist
    from paddle.io import DataLoader, DistributedBatchSampler

    from benchmarks.workloads import BenchLoss, build, get_workload

    wl = get_workload(workload, seed)
    model, dataset, optimizer = build(wl, seed)
    n_params = int(sum(p.size for p in model.parameters() if not p.stop_gradient))
    if recompute:
        from trainer.parallel.recompute import apply_recompute

        apply_recompute(model, RECOMPUTED[workload])
    ddp = paddle.DataParallel(model)
    loader = DataLoader(dataset, batch_sampler=DistributedBatchSampler(dataset, batch_size=wl.batch_size, shuffle=True))
    batches = itertools.cycle(list(loader)) if len(loader) <= 64 else _forever(loader)
    loss_fn = BenchLoss()
    modes = ("in_backward", "none", "deferred")
    for mode in modes:  # warm-up, every path
        _time_steps(ddp, batches, optimizer, loss_fn, max(1, steps // 4), mode)
    wall, cpu = {m: [] for m in modes}, {m: [] for m in modes}
    for _ in range(rounds):
        for mode in modes:
            dist.barrier()
            w, c = _time_steps(ddp, batches, optimizer, loss_fn, steps, mode)
            wall[mode].append(_slowest(w))
            cpu[mode].append(_slowest(c))
    with_sync, without = wall["in_backward"], wall["none"]
    grads = paddle.zeros([n_params], dtype="float32")
    dist.all_reduce(grads)
    dist.barrier()
    k = max(3, min(50, int(1.0 / max(1e-4, 4e-9 * n_params * 4))))
    start = time.perf_counter()
    for _ in range(k):
        dist.all_reduce(grads)
    flat_ms = 1e3 * _slowest((time.perf_counter() - start) / k)
    step_ms, local_ms = 1e3 * common.median(with_sync), 1e3 * common.median(without)
    return {"workload": workload, "params": n_params, "grad_bytes": 4 * n_params, "steps": steps, "rounds": rounds,
            "step_ms": step_ms, "no_sync_step_ms": local_ms, "sync_ms": step_ms - local_ms,
            "sync_share": (step_ms - local_ms) / step_ms, "flat_allreduce_ms": flat_ms,
            "flat_share": flat_ms / step_ms, "step_ms_all": [1e3 * v for v in with_sync],
            "no_sync_ms_all": [1e3 * v for v in without], "recompute": recompute,
            "deferred_step_ms": 1e3 * common.median(wall["deferred"]),
            "cpu_ms": {m: 1e3 * common.median(v) for m, v in cpu.items()},
            # per round: deferred / in-backward, wall and CPU (the blocks of one round ran back to back)
            "deferred_ratio": common.median([d / b for d, b in zip(wall["deferred"], with_sync)]),
            "deferred_cpu_ratio": common.median([d / b for d, b in zip(cpu["deferred"], cpu["in_backward"])])}


def _forever(loader):
    while True:
        yield from loader


def worker(a) -> None:
    common.quiet_paddle_warnings()
    import paddle
    import paddle.distributed as dist

    device = "gpu" if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0 else "cpu"
    if device == "gpu":
        paddle.set_device(f"gpu:{dist.ParallelEnv().device_id}")
    else:
        paddle.set_device("cpu")
    dist.init_parallel_env()
    world, rank = dist.get_world_size(), dist.get_rank()
    sizes = sizes_between(parse_size(a.min_size), parse_size(a.max_size))
    result = {"world_size": world, "device": device, "backend": "nccl" if device == "gpu" else "gloo",
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "collectives": bench_collectives(sizes, world),
              "grad_sync": []}
    defaults = {"mlp": (200, 3), "ernie": (3, 2), "llama": (3, 2)}
    for workload in common.split_list(a.workloads):
        steps, rounds = defaults.get(workload, (5, 2))
        steps = a.sync_steps or steps
        result["grad_sync"].append(bench_grad_sync(workload, steps, a.rounds or rounds, a.seed, a.recompute))
    if rank == 0:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(result, f)


# =============================================================================
# parent
# =============================================================================
def launch(a, attempts: int = 3) -> dict:
    """Run the workers under paddle's launcher. A launch whose TCP store could not start (paddle's libuv store
    aborts when its port was taken between our free_port() and its bind: other jobs on a busy machine) is tried
    again on another port, ``attempts`` in all; any other failure is raised at once."""
    for attempt in range(attempts):
        try:
            return _launch_once(a)
        except common.BenchmarkError as exc:
            if attempt == attempts - 1 or not any(s in str(exc) for s in _STORE_FAILED):
                raise
            print("allreduce: the launcher's TCP store did not start (a port race); trying again", file=sys.stderr)
    raise AssertionError("unreachable")


#: what paddle prints when its TCP store cannot start (CreateOrGetGlobalTCPStore in the C++ traceback)
_STORE_FAILED = ("CreateOrGetGlobalTCPStore", "uv__finish_close")


def _launch_once(a) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-allreduce-", ignore_cleanup_errors=True) as tmp:
        return _launch_in(a, tmp)  # the ranks' logs are in the error, when there is one


def _launch_in(a, tmp: str) -> dict:
    out = os.path.join(tmp, "result.json")
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(a.nproc),
           "--master", f"127.0.0.1:{common.free_port()}", "--log_dir", os.path.join(tmp, "log"),
           os.path.join(common.REPO, "benchmarks", "allreduce.py"), "--worker", "--out", out,
           "--min-size", a.min_size, "--max-size", a.max_size, "--workloads", a.workloads, "--seed", str(a.seed)]
    if a.sync_steps:
        cmd += ["--sync-steps", str(a.sync_steps)]
    if a.rounds:
        cmd += ["--rounds", str(a.rounds)]
    if a.recompute:
        cmd.append("--recompute")
    threads = str(max(1, (os.cpu_count() or 1) // a.nproc))
    env = common.child_env({"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads)})
    proc = subprocess.run(cmd, cwd=common.REPO, env=env, capture_output=True, text=True, timeout=a.timeout)
    if proc.returncode != 0 or not os.path.exists(out):
        raise common.BenchmarkError(f"launch failed ({proc.returncode}): {' '.join(cmd)}\n"
                                    f"{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"
                                    f"{common.launch_logs(os.path.join(tmp, 'log'))}")
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def report(res: dict, info: dict) -> str:
    n = res["world_size"]
    parts = [f"Machine: {common.machine_line(info)}; {common.load_line()} at the end of the run.",
             f"{n} processes, backend {res['backend']} on {res['device']}, OMP_NUM_THREADS={res['omp_num_threads']}.", "",
             "### all_reduce (float32, sum): time per call of the slowest rank, median of 5 timed blocks", ""]
    rows = [[common.fmt_size(r["bytes"]), r["iters"], common.fmt(r["time_us"], 1), common.fmt(r.get("min_time_us"), 1),
             common.fmt(r["algbw_gbps"], 3), common.fmt(r["busbw_gbps"], 3)] for r in res["collectives"]]
    parts.append(common.markdown_table(["size", "calls", "time (µs)", "fastest block (µs)", "algbw (GB/s)",
                                        "busbw (GB/s)"], rows))
    parts += ["", f"busbw = algbw × 2(n−1)/n = algbw × {2 * (n - 1) / n:g}; {NOMINAL_LINKS}.", ""]
    if res["grad_sync"]:
        parts += ["### Share of a training step spent in gradient synchronization", ""]
        rows = []
        for g in res["grad_sync"]:
            rows.append([g["workload"], f"{g['params']:,}", common.fmt_size(g["grad_bytes"]),
                         common.fmt(g["step_ms"], 3), common.fmt(g["no_sync_step_ms"], 3), common.fmt(g["sync_ms"], 3),
                         f"{100 * g['sync_share']:.1f}%", common.fmt(g["flat_allreduce_ms"], 3),
                         f"{100 * g['flat_share']:.1f}%"])
        parts.append(common.markdown_table(
            ["workload", "parameters", "gradients", "step ms (DataParallel)", "step ms (no_sync)", "sync ms",
             "sync share", "one all_reduce of all gradients, ms", "its share"], rows))
        parts += ["", "Step times: median over rounds of the mean step of a block (blocks with and without sync "
                      "alternate; each block's time is the slowest rank's). "
                  + "; ".join(f"{g['workload']}: {g['steps']} steps per block, {g['rounds']} rounds" for g in res["grad_sync"])
                  + ".", ""]
        under = ", every block under recompute" if res["grad_sync"][0].get("recompute") else ""
        parts += [("### DataParallel's average in the last backward against the deferred one (no_sync, then one "
                   f"fused all-reduce: recompute, auto_find_batch_size){under}"), ""]
        rows = [[g["workload"], common.fmt(g["step_ms"], 3), common.fmt(g["deferred_step_ms"], 3),
                 f"{g['deferred_ratio']:.3f}", common.fmt(g["cpu_ms"]["in_backward"], 3),
                 common.fmt(g["cpu_ms"]["deferred"], 3), f"{g['deferred_cpu_ratio']:.3f}"] for g in res["grad_sync"]]
        parts.append(common.markdown_table(["workload", "step ms (in backward)", "step ms (deferred)", "wall ratio",
                                            "CPU ms per step (in backward)", "CPU ms (deferred)", "CPU ratio"], rows))
        parts += ["", ("Ratios: median over rounds of deferred / in-backward, the two blocks of a round run back to "
                       "back; CPU ms: this process's CPU time per step, the slowest rank's."), ""]
    return "\n".join(parts)


def main(argv=None) -> int:
    p = common.Parser(prog="python -m benchmarks allreduce", description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="processes (--nproc_per_node), default 2")
    p.add_argument("--min-size", default="1K", help="smallest buffer (default 1K)")
    p.add_argument("--max-size", default="256M", help="largest buffer (default 256M)")
    p.add_argument("--workloads", default="mlp,ernie", help="gradient-sync workloads (comma-separated; '' for none)")
    p.add_argument("--sync-steps", type=int, help="steps per timed block (default 200 mlp, 3 ernie)")
    p.add_argument("--rounds", type=int, help="alternating rounds of with/without sync (default 3 mlp, 2 ernie)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--recompute", action="store_true", help="gradient-sync blocks under the trainer's recompute")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--markdown", type=common.output_file, help="also write the report to this file")
    p.add_argument("--json", type=common.output_file, help="write the raw measurements to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a)
        return 0
    if a.nproc < 2:
        p.error("--nproc must be >= 2: an all-reduce needs two processes")
    info = common.machine_info()
    print(f"# allreduce: {a.nproc} processes; {common.machine_line(info)}", flush=True)
    res = launch(a)
    text = report(res, info)
    print(text)
    common.write_outputs(text, {"machine": info, "result": res}, a.markdown, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
