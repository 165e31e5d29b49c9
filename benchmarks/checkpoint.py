"""What checkpoints cost: the training stall of a save (synchronous against
asynchronous), checkpoint size, load time, and resume time against the
position in the epoch.

Stall (one child process per mode, ``save_async`` false, then true): an MLP of
``--params`` million parameters (default 20 M: 1024 -> H -> H -> 1024) trains
with AdamW, saving every ``--every`` steps. A callback stamps a host clock at
every ``on_step_end``; a save runs right after the step that triggers it, so
it lands in the interval that ends with the next step. ``stall`` = that
interval minus the median interval of the synchronous run's steps that are not
near a save (the reference step); ``lost per save`` = the sum, over the
``--every`` intervals after a save, of their excess over the reference step:
the training time a checkpoint costs in all, including the background writer
competing with training for the CPU. ``--busy 0,2`` runs both modes idle, then
beside 2 CPU-burning processes (a loaded 2-core machine), each against the
sync run's reference step under the same load, and gives async / sync. Medians over the saves (the final save at
the end of fit() is not counted). The asynchronous save copies the state to
host memory at the step (that copy is its stall) and writes the files in a
thread.

Size and load: the bytes of each file of the last checkpoint; the median time
of ``trainer.checkpoint.manifest.verify`` (sha256 of every file), of a whole
``Trainer.load_checkpoint`` into the same model (each file read once, hashed
while it is read, verified before it is parsed) and of a bare load of the same
files (safetensors read + ``set_state_dict``, no check: what a hand-written
loop's ``paddle.load`` resume does), interleaved; the ratio of the last two is
the cost of verification.

Resume against position (one child process): a tiny MLP over a lazily
generated dataset of ``--epoch-samples`` samples (default 1,280,000, the size
of ImageNet-1k; 20,000 steps of batch 64 per epoch). A real checkpoint is
saved at step 10; for each position P the benchmark writes a copy whose
``trainer.json`` says step P of epoch 0 (global_step, step_in_epoch,
samples_seen and the scheduler's counter) with a re-signed manifest, so the
copies differ only in the position, then times, in a fresh Trainer,
``fit(resume_from_checkpoint=copy)`` from the call to the end of the first
training step after the resume, and separately the load and the wait for the
first batch. The sampler computes its position, so this should be flat in P.
For contrast, the last column estimates what replaying the P consumed batches
through the DataLoader would cost (the per-batch time of iterating the same
DataLoader, measured over ``--replay-measure`` batches, times P).

Run::

    python -m benchmarks checkpoint                       # the short default, under 2 minutes
    python -m benchmarks checkpoint --params 50 --saves 5 --every 20
    python -m benchmarks checkpoint --busy 0,2            # idle, then with 2 CPU-burning processes beside
    python -m benchmarks checkpoint --positions 10,100000 --epoch-samples 12800000
    python -m benchmarks.checkpoint --child stall --save-async 1 --params 5   # one measurement
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import statistics
import sys
import tempfile
import time
from typing import List

try:
    from benchmarks import common
except ImportError:  # run as a file
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import common


# ---- child: stall, size, load ------------------------------------------------------------
def _hidden_for(params_m: float, width: int = 1024) -> int:
    """H such that 1024*H + H*H + H*1024 (+ biases) is about ``params_m`` million."""
    target = params_m * 1e6
    h = 64
    while 2 * width * h + h * h + 2 * h + width < target:
        h += 64
    return h


def child_stall(save_async: bool, params_m: float, saves: int, every: int, batch: int, out_dir: str) -> dict:
    common.quiet_paddle_warnings()
    import numpy as np
    import paddle

    from callbacks.base import Callback
    from trainer import Trainer, TrainingArguments
    from trainer.checkpoint.manifest import verify

    width = 1024
    hidden = _hidden_for(params_m, width)

    class Synthetic(paddle.io.Dataset):
        def __init__(self, n):
            rng = np.random.RandomState(0)
            self.x = rng.randn(n, width).astype("float32")
            self.y = rng.randn(n, width).astype("float32")

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i], self.y[i]

    class Clock(Callback):
        order = 1000

        def __init__(self):
            self.stamps, self.saved_at = [], []

        def on_step_end(self, trainer):
            self.stamps.append(time.perf_counter())

        def on_save_end(self, trainer):
            self.saved_at.append(trainer.state.global_step)

    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(width, hidden), paddle.nn.ReLU(), paddle.nn.Linear(hidden, hidden),
                                 paddle.nn.ReLU(), paddle.nn.Linear(hidden, width))
    n_params = sum(int(np.prod(p.shape)) for p in model.parameters())
    max_steps = every * (saves + 1)  # the end-of-fit save (not counted) comes a full period after the last one
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch, max_steps=max_steps,
                             learning_rate=1e-4, lr_scheduler_type="constant", save_strategy="steps",
                             save_steps=every, save_async=save_async, report_to=[], evaluation_strategy="no")
    clock = Clock()
    trainer = Trainer(model, args, train_dataset=Synthetic(max(512, batch * 64)), loss_fn=paddle.nn.MSELoss(),
                      callbacks=[clock])
    start = time.perf_counter()
    trainer.fit()
    fit_seconds = time.perf_counter() - start

    # intervals[i] ends at step i + 2 (stamps[0] is the end of step 1)
    intervals = [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]
    in_loop = [s for s in clock.saved_at if s < max_steps]
    near = set()
    for s in in_loop:
        near.update((s + 1, s + 2))  # the interval that holds the save, and the one after it
    normal = [iv for i, iv in enumerate(intervals) if (i + 2) not in near and i >= 2]  # skip 2 warm-up steps
    after_save = {s: [intervals[t - 2] for t in range(s + 1, min(s + 1 + every, len(intervals) + 2))]
                  for s in in_loop}

    ckpt = os.path.join(out_dir, "checkpoints", f"step-{max_steps}")
    with open(os.path.join(ckpt, "manifest.json"), encoding="utf-8") as f:
        files = {name: meta["bytes"] for name, meta in json.load(f)["files"].items()}
    # the two halves of a save, timed apart: the copy to host memory (the async stall) and the files
    snapshot_times, write_times = [], []
    try:
        from trainer.checkpoint import snapshot as ckpt_snapshot
        from trainer.checkpoint import writer as ckpt_writer

        for i in range(2):
            t = time.perf_counter()
            snap = ckpt_snapshot.snapshot(trainer)
            snapshot_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            ckpt_writer.write_snapshot(snap, os.path.join(out_dir, f"probe-{i}"), None)
            write_times.append(time.perf_counter() - t)
            del snap
    except (AttributeError, TypeError):  # the checkpoint API moved: leave these columns empty
        snapshot_times, write_times = [None], [None]
    verify_times, load_times, bare_times, load_cpu, bare_cpu = [], [], [], [], []
    for _ in range(5):  # interleaved: verify, our load, a bare load of the same files into the same objects
        t = time.perf_counter()
        verify(ckpt)
        verify_times.append(time.perf_counter() - t)
        t, c = time.perf_counter(), time.process_time()
        trainer.load_checkpoint(ckpt)
        load_times.append(time.perf_counter() - t)
        load_cpu.append(time.process_time() - c)
        t, c = time.perf_counter(), time.process_time()
        bare_load(trainer, ckpt)
        bare_times.append(time.perf_counter() - t)
        bare_cpu.append(time.process_time() - c)
    return {"mode": "async" if save_async else "sync", "params": n_params, "hidden": hidden, "batch": batch,
            "every": every, "saves": in_loop, "intervals": intervals, "normal": normal, "after_save": after_save,
            "fit_seconds": fit_seconds, "files": files, "verify_s": statistics.median(verify_times),
            "load_s": statistics.median(load_times), "bare_load_s": statistics.median(bare_times),
            "load_ratios": [a / b for a, b in zip(load_times, bare_times)],
            "load_cpu_ratios": [a / b for a, b in zip(load_cpu, bare_cpu)], "snapshot_s": common.median(snapshot_times),
            "write_s": common.median(write_times), "peak_rss_mb": common.peak_rss_mb()}


def bare_load(trainer, ckpt: str) -> None:
    """What a hand-written resume does with the same files (the ``paddle.load`` + ``set_state_dict`` of a
    bare loop, with safetensors): read the tensors and JSON, set model and optimizer; no check of any kind."""
    from safetensors.numpy import load_file

    import paddle
    from trainer.checkpoint.snapshot import join_optimizer_state, param_name_map

    model_state = load_file(os.path.join(ckpt, "model.safetensors"))
    opt_tensors = load_file(os.path.join(ckpt, "optimizer.safetensors"))
    with open(os.path.join(ckpt, "trainer.json"), encoding="utf-8") as f:
        meta = json.load(f)
    trainer.model.set_state_dict({k: paddle.to_tensor(v) for k, v in model_state.items()})
    trainer.optimizer.set_state_dict(join_optimizer_state(opt_tensors, meta["optimizer_scalars"],
                                                          param_name_map(trainer.model)))
    trainer.state.load_state_dict(meta["state"])


# ---- child: resume against position ---------------------------------------------------------
def child_resume(positions: List[int], epoch_samples: int, batch: int, repeats: int, replay_measure: int,
                 out_dir: str) -> dict:
    common.quiet_paddle_warnings()
    import hashlib

    import numpy as np
    import paddle

    from callbacks.base import Callback
    from trainer import Trainer, TrainingArguments
    from trainer.events import Event

    class Lazy(paddle.io.Dataset):
        """``n`` samples computed from their index (no memory for a long epoch)."""

        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            x = np.full(8, (i % 997) / 997.0, dtype="float32")
            return x, np.int64(i % 2)

    class FirstStep(Callback):
        def __init__(self):
            self.first_step_end = self.load_begin = self.load_end = None

        def on_load_begin(self, trainer):
            self.load_begin = time.perf_counter()

        def on_load_end(self, trainer):
            self.load_end = time.perf_counter()

        def on_step_end(self, trainer):
            if self.first_step_end is None:
                self.first_step_end = time.perf_counter()
                self.first_wait = trainer.state.last_data_wait

    def make(max_steps, out, callbacks=()):
        paddle.seed(0)
        model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 2))
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch, max_steps=max_steps,
                                 learning_rate=1e-3, lr_scheduler_type="constant", save_strategy="no",
                                 save_async=False, report_to=[], evaluation_strategy="no")
        return Trainer(model, args, train_dataset=Lazy(epoch_samples), loss_fn=paddle.nn.CrossEntropyLoss(),
                       callbacks=list(callbacks))

    steps_per_epoch = epoch_samples // batch
    base_dir = os.path.join(out_dir, "base")
    t = make(10, base_dir)
    t.fit()
    base = t.save_checkpoint()
    t.wait_for_checkpoint()

    def at_position(p):
        """A copy of the step-10 checkpoint that says step p of epoch 0, re-signed."""
        run = os.path.join(out_dir, f"pos-{p}")
        ckpt = os.path.join(run, "checkpoints", f"step-{p}")
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(base, ckpt)
        meta_path = os.path.join(ckpt, "trainer.json")
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        meta["state"].update(global_step=p, step_in_epoch=p, epoch=0, samples_seen=p * batch)
        if isinstance(meta.get("lr_scheduler"), dict) and "last_epoch" in meta["lr_scheduler"]:
            meta["lr_scheduler"]["last_epoch"] = p
        with open(meta_path, "w", encoding="utf-8") as f:
            json.dump(meta, f)
        man_path = os.path.join(ckpt, "manifest.json")
        with open(man_path, encoding="utf-8") as f:
            manifest = json.load(f)
        with open(meta_path, "rb") as f:
            data = f.read()
        manifest["files"]["trainer.json"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        manifest["step"] = p
        with open(man_path, "w", encoding="utf-8") as f:
            json.dump(manifest, f)
        return run, ckpt

    def resume_once(p):
        run, ckpt = at_position(p)
        probe = FirstStep()
        trainer = make(p + 1, run, [probe])
        start = time.perf_counter()
        trainer.fit(resume_from_checkpoint=ckpt)
        if trainer.state.global_step != p + 1 or trainer.state.step_in_epoch != p + 1:
            raise RuntimeError(f"resumed at the wrong place: {trainer.state.global_step}, {trainer.state.step_in_epoch}")
        return {"to_first_step": probe.first_step_end - start, "load": probe.load_end - probe.load_begin,
                "first_batch_wait": probe.first_wait}

    resume_once(positions[0])  # warm-up: first-call costs of paddle ops
    rows = {p: [] for p in positions}
    for _ in range(repeats):
        for p in positions:  # interleaved, so drift hits every position alike
            rows[p].append(resume_once(p))

    # what replaying would cost: iterate the same DataLoader from the start of the epoch
    t = make(1, os.path.join(out_dir, "replay"))
    loader = t.get_train_dataloader()
    it = iter(loader)
    next(it)
    start = time.perf_counter()
    for _ in range(replay_measure):
        next(it)
    per_batch = (time.perf_counter() - start) / replay_measure

    summary = {p: {k: statistics.median(r[k] for r in rows[p]) for k in rows[p][0]} for p in positions}
    return {"positions": positions, "steps_per_epoch": steps_per_epoch, "epoch_samples": epoch_samples,
            "batch": batch, "repeats": repeats, "summary": {str(p): v for p, v in summary.items()},
            "replay_per_batch_s": per_batch, "replay_measured": replay_measure}


# ---- parent -------------------------------------------------------------------------------------
def _ms(seconds) -> str:
    return common.fmt(1000.0 * seconds, 0) if seconds is not None else "n/a"


def report(stall: List[dict], resume: dict, info: dict, load_line: str) -> str:
    sync = next(r for r in stall if r["mode"] == "sync")
    reference = statistics.median(sync["normal"])
    lines = [f"## Checkpoint cost ({common.machine_line(info)})", "", load_line, ""]
    lines += [f"MLP of {sync['params'] / 1e6:.1f} M parameters (hidden {sync['hidden']}), AdamW, batch {sync['batch']}, "
              f"a save every {sync['every']} steps; reference step (median of the sync run's steps not right after a save): {_ms(reference)} ms; "
              f"medians over {len(sync['saves'])} saves.", ""]
    rows = []

    def reference_of(r):  # the sync run's normal step beside the same load
        same = [x for x in stall if x["mode"] == "sync" and x.get("busy", 0) == r.get("busy", 0)]
        return statistics.median(same[0]["normal"]) if same else reference

    for r in stall:
        ref = reference_of(r)
        stalls = [r["after_save"][s][0] - ref for s in r["saves"] if r["after_save"][s]]
        lost = [sum(iv - ref for iv in r["after_save"][s]) for s in r["saves"]]
        rows.append([f"save_async={'true' if r['mode'] == 'async' else 'false'}", str(r.get("busy", 0)),
                     _ms(common.median(stalls)),
                     _ms(min(stalls) if stalls else None) + " - " + _ms(max(stalls) if stalls else None),
                     _ms(common.median(lost)), common.fmt(r["fit_seconds"], 1)])
    lines.append(common.markdown_table(["save", "busy processes", "stall at the save step (ms)", "range (ms)",
                                        f"training time lost per save, over {sync['every']} steps (ms)",
                                        "whole fit() (s)"], rows))
    lines.append("")
    ratios = []
    for busy in sorted({r.get("busy", 0) for r in stall}):
        lost = {r["mode"]: common.median([sum(iv - reference_of(r) for iv in r["after_save"][s]) for s in r["saves"]])
                for r in stall if r.get("busy", 0) == busy}
        if "sync" in lost and "async" in lost and lost["sync"]:
            ratios.append([str(busy), common.fmt(lost["async"] / lost["sync"], 2)])
    if ratios:
        lines.append(common.markdown_table(["busy processes", "time lost per save, async / sync"], ratios))
        lines.append("")
    files = sync["files"]
    total = sum(files.values())
    size_rows = [[name, common.fmt_size(size)] for name, size in sorted(files.items())] + [["total", common.fmt_size(total)]]
    lines.append(common.markdown_table(["checkpoint file", "size"], size_rows))
    lines.append("")
    def rate(seconds):
        return f"{total / 2 ** 20 / seconds:.0f} MiB/s" if seconds and seconds == seconds else "n/a"

    lines.append(common.markdown_table(
        ["part of a save or load", "median (ms)", "throughput"],
        [["snapshot: copy the state to host memory (at the step)", _ms(sync["snapshot_s"]), rate(sync["snapshot_s"])],
         ["write: files, fsync, sha256, rename (background when async)", _ms(sync["write_s"]), rate(sync["write_s"])],
         ["manifest verify (sha256 of every file)", _ms(sync["verify_s"]), rate(sync["verify_s"])],
         ["Trainer.load_checkpoint (read once, hashing while reading, + set)", _ms(sync["load_s"]), rate(sync["load_s"])],
         ["bare load of the same files (safetensors read + set_state_dict, no check)", _ms(sync.get("bare_load_s")),
          rate(sync.get("bare_load_s"))]]))
    lines.append("")
    if sync.get("load_ratios"):
        ratios = sync["load_ratios"]
        cpu = sync.get("load_cpu_ratios") or [float("nan")]
        lines.append(f"Load against the bare load, per interleaved pair: median {common.median(ratios):.2f}x wall "
                     f"(range {min(ratios):.2f}-{max(ratios):.2f}x over {len(ratios)} pairs), {common.median(cpu):.2f}x "
                     f"CPU time (range {min(cpu):.2f}-{max(cpu):.2f}x); target <= 1.2x.")
        lines.append("")
    lines += [f"Resume against the position in a {resume['steps_per_epoch']:,}-step epoch "
              f"({resume['epoch_samples']:,} samples, batch {resume['batch']}), median of {resume['repeats']}:", ""]
    rrows = []
    for p in resume["positions"]:
        s = resume["summary"][str(p)]
        rrows.append([f"{p:,}", _ms(s["to_first_step"]), _ms(s["load"]), _ms(s["first_batch_wait"]),
                      common.fmt(p * resume["replay_per_batch_s"], 1)])
    lines.append(common.markdown_table(["resume at step", "fit() call to end of first step (ms)", "load (ms)",
                                        "first batch wait (ms)", "replaying instead (s, est.)"], rrows))
    lines.append("")
    lines.append(f"(replay estimate: {1e3 * resume['replay_per_batch_s']:.2f} ms per batch, measured over "
                 f"{resume['replay_measured']} batches of the same DataLoader)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks checkpoint", description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=float, default=20, help="MLP parameters, in millions (default 20)")
    p.add_argument("--saves", type=int, default=3, help="in-loop saves per mode (default 3)")
    p.add_argument("--every", type=int, default=8, help="steps between saves (default 8)")
    p.add_argument("--batch", type=int, default=16, help="batch of the stall runs (default 16)")
    p.add_argument("--positions", default="10,1000,10000,19990", help="resume positions (default 10,1000,10000,19990)")
    p.add_argument("--epoch-samples", type=int, default=1_280_000, help="samples per epoch of the resume runs")
    p.add_argument("--resume-batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="resumes per position (default 3)")
    p.add_argument("--replay-measure", type=int, default=300, help="batches iterated to estimate replay cost")
    p.add_argument("--busy", default="0", help="CPU-burning processes beside the stall runs, a list run in turn "
                   "(default 0; 0,2: idle, then both cores of a 2-core machine kept busy)")
    p.add_argument("--dir", default=None, help="where checkpoints are written (default: a temporary directory)")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--markdown", help="also write the report to this file")
    p.add_argument("--json", help="write the raw measurements to this file")
    # --child stall | resume (one measurement per process), or a comma list with --save-async 0,1: several in
    # one process (the smoke test: one paddle import instead of three), each in its own directory under --out
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--save-async", default="0", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    positions = [int(x) for x in common.split_list(a.positions)]
    if a.child:
        jobs = [(kind, int(mode)) for kind in common.split_list(a.child)
                for mode in (common.split_list(a.save_async) if kind == "stall" else [0])]
        if any(kind not in ("stall", "resume") for kind, _ in jobs):
            p.error(f"--child {a.child!r}: choose stall, resume or both")
        for kind, mode in jobs:
            out = a.out if len(jobs) == 1 else os.path.join(a.out, f"{kind}-{mode}")
            if kind == "stall":
                common.emit(child_stall(bool(mode), a.params, a.saves, a.every, a.batch, out))
            else:
                common.emit(child_resume(positions, a.epoch_samples, a.resume_batch, a.repeats, a.replay_measure, out))
        return 0
    if a.saves < 1 or a.every < 2:
        p.error("--saves must be >= 1 and --every >= 2")
    if max(positions) >= a.epoch_samples // a.resume_batch:
        p.error(f"--positions must be below the {a.epoch_samples // a.resume_batch} steps of an epoch")

    info = common.machine_info()
    print(f"# checkpoint: {a.params:g} M parameters, {a.saves} saves every {a.every} steps; "
          f"{common.machine_line(info)}", flush=True)
    root = tempfile.mkdtemp(prefix="bench-ckpt-", dir=a.dir)
    stall = []
    try:
        for busy in (int(b) for b in common.split_list(a.busy)):  # idle, then the machine kept busy, in one run
            for mode in (0, 1):
                out = os.path.join(root, f"stall-{mode}")
                cmd = [sys.executable, "-m", "benchmarks.checkpoint", "--child", "stall", "--save-async", str(mode),
                       "--params", str(a.params), "--saves", str(a.saves), "--every", str(a.every),
                       "--batch", str(a.batch), "--out", out]
                burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
                try:
                    res = common.run_child(cmd, timeout=a.timeout)
                finally:
                    for b in burners:
                        b.kill()
                        b.wait()
                res["busy"] = busy
                stall.append(res)
                shutil.rmtree(out, ignore_errors=True)
                print(f"  save_async={bool(mode)}, {busy} busy: fit {res['fit_seconds']:.1f} s, saves at {res['saves']}",
                      flush=True)
        cmd = [sys.executable, "-m", "benchmarks.checkpoint", "--child", "resume", "--positions", a.positions,
               "--epoch-samples", str(a.epoch_samples), "--resume-batch", str(a.resume_batch),
               "--repeats", str(a.repeats), "--replay-measure", str(a.replay_measure),
               "--out", os.path.join(root, "resume")]
        resume = common.run_child(cmd, timeout=a.timeout)
        print(f"  resume: {len(positions)} positions x {a.repeats}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    # JSON keys of after_save come back as strings
    for r in stall:
        r["after_save"] = {int(k): v for k, v in r["after_save"].items()}
    text = report(stall, resume, info, common.load_line())
    print()
    print(text)
    common.write_outputs(text, {"machine": info, "stall": stall, "resume": resume}, a.markdown, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
