"""What a save costs the training thread: synchronous against asynchronous, interleaved in one process.

One child process trains an MLP of ``--params`` million parameters (1024 -> H -> H -> 1024, AdamW) and
cycles through periods of ``--every`` steps: one with no save (the reference), one that starts with a
synchronous save, one that starts with an asynchronous one (the order of the last two alternates by
round, so drift in the machine's load hits both alike). A period ends once the step is done *and* the
background write has finished (``wait_for_checkpoint``), so a write that outlasts its period is charged to
it. Per period:

* ``lost``: its wall time minus the mean of the two save-free periods around it (training time a save
  cost in all: the copy at the step, the write when synchronous, the writer competing when not);
* ``stall``: its first step interval (the save is in it) minus the median save-free step interval;
* where the training thread's time went (``/proc/self/task/TID/schedstat``): on a CPU, waiting for a
  CPU (the run queue), and off both (asleep: the GIL, or the disk when it writes itself); and the CPU
  time of every other thread (the writer);
* ``blocked`` = the training thread's extra CPU + asleep: what the save costs it where a core is free
  for the writer; ``saturated`` = blocked + the other threads' CPU: the cost where every CPU-second
  the writer uses is one the training thread does not get (a machine kept full). Both are counted in
  CPU and sleep time, so neighbours that come and go move them far less than the wall-clock ``lost``
  (which on a shared machine carries their noise: see its range).

Medians over ``--rounds`` rounds. ``--busy N`` keeps N ``stress-ng --cpu`` workers (Python spinners
without stress-ng) beside the child, started by the parent in its own session (the child's autogroup):
they compete with the training and writer threads for the 2 cores thread by thread, as DataLoader
workers do.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import List

MODES = ("none", "sync", "async")


def _schedstat(tid: int) -> tuple:
    """(seconds on a CPU, seconds waiting in the run queue) of thread ``tid`` of this process."""
    with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as f:
        on_cpu, waiting, _ = f.read().split()
    return int(on_cpu) / 1e9, int(waiting) / 1e9


def make_probe(every: int, warm: int):
    """A callback that stamps every step end and runs the save cycle (:data:`MODES`)."""
    from callbacks.base import Callback

    class Probe(Callback):
        order = 1000  # after every other callback's on_step_end

        def __init__(self):
            self.tid = threading.get_native_id()  # the training thread
            self.stamps, self.periods = [], []  # stamps: (step, wall, cpu, run queue, process cpu)

        def on_step_end(self, trainer):
            step = trainer.state.global_step
            boundary = step >= warm and (step - warm) % every == 0
            if boundary:
                trainer.wait_for_checkpoint()  # a write still running belongs to the period that started it
            cpu, queue = _schedstat(self.tid)
            self.stamps.append((step, time.perf_counter(), cpu, queue, time.process_time()))
            if boundary:
                k = len(self.periods)
                round_, slot = divmod(k, len(MODES))
                mode = MODES[slot] if slot == 0 or round_ % 2 == 0 else MODES[3 - slot]  # none, sync, async / none, async, sync
                self.periods.append({"mode": mode, "start": len(self.stamps) - 1})
                if mode != "none":
                    trainer.args.save_async = mode == "async"
                    trainer.save_checkpoint()

    return Probe()


def periods_of(probe) -> List[dict]:
    """Each complete period's totals (seconds) from the probe's stamps."""
    out = []
    for p, nxt in zip(probe.periods, probe.periods[1:]):
        a, b = probe.stamps[p["start"]], probe.stamps[nxt["start"]]
        first = probe.stamps[p["start"] + 1][1] - a[1]
        intervals = [y[1] - x[1] for x, y in zip(probe.stamps[p["start"]:nxt["start"]],
                                                  probe.stamps[p["start"] + 1:nxt["start"] + 1])]
        wall, cpu, queue = b[1] - a[1], b[2] - a[2], b[3] - a[3]
        out.append({"mode": p["mode"], "wall": wall, "cpu": cpu, "queue": queue, "asleep": wall - cpu - queue,
                    "others_cpu": (b[4] - a[4]) - cpu, "first": first, "intervals": intervals})
    return out


def summarize(periods: List[dict]) -> dict:
    """Per mode: medians of lost, stall and the training thread's time split, each against the save-free
    periods around it (the nearest one before and after)."""
    free = [i for i, p in enumerate(periods) if p["mode"] == "none"]
    ref_step = statistics.median(iv for i in free for iv in periods[i]["intervals"])
    rows = {}
    for i, p in enumerate(periods):
        if p["mode"] == "none":
            continue
        around = [j for j in (max((j for j in free if j < i), default=None), min((j for j in free if j > i), default=None))
                  if j is not None]
        if not around:
            continue

        def base(key, around=around):
            return statistics.mean(periods[j][key] for j in around)

        row = {"lost": p["wall"] - base("wall"), "stall": p["first"] - ref_step, "cpu": p["cpu"] - base("cpu"),
               "queue": p["queue"] - base("queue"), "asleep": p["asleep"] - base("asleep"),
               "others_cpu": p["others_cpu"] - base("others_cpu")}
        row["blocked"] = row["cpu"] + row["asleep"]  # the training thread's own extra time, whatever the neighbours do
        row["saturated"] = row["blocked"] + row["others_cpu"]  # ... plus every CPU-second the writer took
        rows.setdefault(p["mode"], []).append(row)
    return {"ref_step": ref_step, "free_period": statistics.median(periods[i]["wall"] for i in free),
            "modes": {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} | {"n": len(rs),
                          "lost_all": [r["lost"] for r in rs]}
                      for m, rs in rows.items()}}


def table(results: List[dict]) -> List[List[str]]:
    """Rows of the save table: one per (load, mode), then the async / sync ratios."""
    rows = []
    for res in results:
        s = res["summary"]
        for mode in ("sync", "async"):
            m = s["modes"].get(mode)
            if m is None:
                continue
            spread = f"{1e3 * min(m['lost_all']):.0f} - {1e3 * max(m['lost_all']):.0f}"
            rows.append([res["load"], mode, f"{1e3 * m['stall']:.0f}", f"{1e3 * m['lost']:.0f}", spread,
                         f"{1e3 * m['cpu']:.0f}", f"{1e3 * m['queue']:.0f}", f"{1e3 * m['asleep']:.0f}",
                         f"{1e3 * m['others_cpu']:.0f}", f"{1e3 * m['blocked']:.0f}", f"{1e3 * m['saturated']:.0f}",
                         str(m["n"])])
    return rows


HEADERS = ["load", "save", "stall at the save step (ms)", "training time lost per save (ms)", "lost: range (ms)",
           "training thread: more CPU (ms)", "more run-queue wait (ms)", "more asleep (GIL, disk) (ms)",
           "other threads' CPU (ms)", "training thread blocked: CPU + asleep (ms)",
           "saturated machine: blocked + other threads' CPU (ms)", "saves"]


def ratios(results: List[dict]) -> List[List[str]]:
    out = []
    for res in results:
        modes = res["summary"]["modes"]
        if "sync" in modes and "async" in modes:
            sync, async_ = modes["sync"], modes["async"]
            out.append([res["load"], f"{1e3 * sync['lost']:.0f}", f"{1e3 * async_['lost']:.0f}"]
                       + [_ratio(async_[k], sync[k]) for k in ("lost", "stall", "blocked", "saturated")])
    return out


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "n/a"


RATIO_HEADERS = ["load", "sync: lost per save (ms)", "async: lost per save (ms)", "lost, async / sync",
                 "stall, async / sync", "blocked, async / sync", "saturated machine, async / sync"]


# ---- the writer: python -m benchmarks.save_stall --writers buffered:8,buffered:128,direct:32 --------------------
def parse_writers(text: str) -> List[tuple]:
    """``"buffered:128,direct:32"`` -> [("buffered", 128), ("direct", 32)]: how the file is written (through the
    page cache or with ``O_DIRECT``) and the piece (``CHUNK``) or staging buffer (``STAGING``) size in MiB."""
    from benchmarks import common

    writers = []
    for item in common.split_list(text):
        how, _, mib = item.partition(":")
        if how not in ("buffered", "direct") or not mib.isdigit() or int(mib) < 1:
            raise ValueError(f"--writers: {item!r} is not buffered:MIB or direct:MIB")
        writers.append((how, int(mib)))
    return writers


def writers(variants: List[tuple], rounds: int, total_mib: int, out_dir: str) -> List[dict]:
    """The writer thread's CPU per file of ``total_mib`` MiB for each (how, MiB) of ``variants``, with a paddle
    MLP training in the main thread meanwhile, and the training thread's extra CPU and sleep against as many
    steps alone (interleaved over the variants, ``rounds`` times; medians)."""
    import numpy as np
    import paddle

    from trainer.checkpoint import tensor_file

    model = paddle.nn.Sequential(paddle.nn.Linear(1024, 2048), paddle.nn.ReLU(), paddle.nn.Linear(2048, 1024))
    opt = paddle.optimizer.AdamW(1e-4, parameters=model.parameters())
    x, y = paddle.randn([16, 1024]), paddle.randn([16, 1024])

    def step():
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()

    rng = np.random.RandomState(0)
    arrays = {f"t{i}": rng.randn(total_mib * 2 ** 20 // 4 // 6).astype("float32") for i in range(6)}
    path, main = f"{out_dir}/pieces.safetensors", threading.get_native_id()
    rows = {variant: [] for variant in variants}
    saved = tensor_file.DIRECT, tensor_file.CHUNK, tensor_file.STAGING
    try:
        for _ in range(rounds):
            for how, mib in variants:
                tensor_file.DIRECT = how == "direct"
                tensor_file.CHUNK = tensor_file.STAGING = mib << 20
                writer_cpu = []
                thread = threading.Thread(target=_write_timed, args=(tensor_file.save_tensors, arrays, path, writer_cpu))
                t0, (c0, q0) = time.perf_counter(), _schedstat(main)
                thread.start()
                n = 0
                while thread.is_alive():
                    step()
                    n += 1
                thread.join()
                t1, (c1, q1) = time.perf_counter(), _schedstat(main)
                for _ in range(n):
                    step()
                t2, (c2, q2) = time.perf_counter(), _schedstat(main)
                rows[(how, mib)].append({
                    "writer_cpu": writer_cpu[0], "cpu": (c1 - c0) - (c2 - c1), "wall": t1 - t0,
                    "asleep": ((t1 - t0) - (c1 - c0) - (q1 - q0)) - ((t2 - t1) - (c2 - c1) - (q2 - q1))})
    finally:
        tensor_file.DIRECT, tensor_file.CHUNK, tensor_file.STAGING = saved
    return [{"how": how, "mib": mib, **{k: statistics.median(r[k] for r in rs) for k in rs[0]}}
            for (how, mib), rs in rows.items()]


def _write_timed(save, arrays, path, cpu: list) -> None:
    save(arrays, path)
    cpu.append(time.thread_time())  # this thread's CPU since it started: the whole write


def main(argv=None) -> int:
    import tempfile

    from benchmarks import common

    p = common.Parser(prog="python -m benchmarks.save_stall",
                                description="the checkpoint writer's CPU per file, by how it writes and in what pieces")
    p.add_argument("--writers", default="buffered:8,buffered:128,direct:8,direct:32",
                   help="variants to compare, each buffered:MIB (through the page cache, tensor_file.CHUNK) or "
                        "direct:MIB (O_DIRECT from a staging buffer, tensor_file.STAGING) "
                        "(default buffered:8,buffered:128,direct:8,direct:32)")
    p.add_argument("--mib", type=int, default=231, help="file size, MiB (default 231: the 20 M-parameter checkpoint)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--dir", type=common.existing_dir, default=None, help="where the file is written (default: a temporary directory on the "
                   "filesystem of the current one; O_DIRECT needs a disk, not tmpfs)")
    a = p.parse_args(argv)
    try:
        variants = parse_writers(a.writers)
    except ValueError as exc:
        p.error(str(exc))
    common.quiet_paddle_warnings()
    with tempfile.TemporaryDirectory(prefix="bench-writers-", dir=a.dir or ".") as out:
        rows = writers(variants, a.rounds, a.mib, out)
    print(common.load_line())
    print(common.markdown_table(["writer", "writer thread's CPU per file (ms)", "write, wall (ms)",
                                 "training thread: more CPU (ms)", "training thread: more asleep (ms)"],
                                [[f"{r['how']} {r['mib']} MiB", f"{1e3 * r['writer_cpu']:.0f}", f"{1e3 * r['wall']:.0f}",
                                  f"{1e3 * r['cpu']:.0f}", f"{1e3 * r['asleep']:.0f}"] for r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
