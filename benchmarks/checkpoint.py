"""What checkpoints cost: the training stall of a save (synchronous against
asynchronous), checkpoint size, load time, and resume time against the
position in the epoch.

Stall (one child process per load, :mod:`benchmarks.save_stall`): an MLP of ``--params`` million
parameters (default 20 M: 1024 -> H -> H -> 1024) trains with AdamW in periods of ``--every`` steps that
cycle no save / a synchronous save / an asynchronous one, ``--rounds`` times, interleaved so that the
machine's drifting load hits both modes alike. ``lost per save`` = a period's wall time minus that of
the save-free periods around it (including a background write that outlasts the period: the next
period starts once it is done); ``stall`` = the step interval holding the save minus the median
save-free one; and where the training thread's extra time went: CPU, run-queue wait, asleep (the GIL,
the disk), and the CPU of the other threads (the writer). ``--busy 0,2`` (the default) runs the cycle
beside nothing, then beside ``stress-ng --cpu 2``, and gives async / sync for each.

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

    python -m benchmarks checkpoint                       # the default: idle, then beside stress-ng --cpu 2
    python -m benchmarks checkpoint --params 50 --rounds 5 --every 20
    python -m benchmarks checkpoint --busy 0              # beside nothing only
    python -m benchmarks checkpoint --positions 10,100000 --epoch-samples 12800000
    python -m benchmarks.checkpoint --child stall --params 5 --out /tmp/x   # one measurement
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
    from benchmarks import common, save_stall
except ImportError:  # run as a file
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import common, save_stall


# ---- child: stall, size, load ------------------------------------------------------------
def _hidden_for(params_m: float, width: int = 1024) -> int:
    """H such that 1024*H + H*H + H*1024 (+ biases) is about ``params_m`` million."""
    target = params_m * 1e6
    h = 64
    while 2 * width * h + h * h + 2 * h + width < target:
        h += 64
    return h


def child_stall(params_m: float, rounds: int, every: int, batch: int, out_dir: str) -> dict:
    """The save cycle of :mod:`benchmarks.save_stall` (no save, sync, async; ``rounds`` times), then the size, the
    two halves of a save timed apart and the loads."""
    common.quiet_paddle_warnings()
    import numpy as np
    import paddle

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

    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(width, hidden), paddle.nn.ReLU(), paddle.nn.Linear(hidden, hidden),
                                 paddle.nn.ReLU(), paddle.nn.Linear(hidden, width))
    n_params = sum(int(np.prod(p.shape)) for p in model.parameters())
    warm = 3  # steps before the first period: paddle's first-call costs
    max_steps = warm + every * len(save_stall.MODES) * rounds  # the last boundary only closes the period before
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch, max_steps=max_steps,
                             learning_rate=1e-4, lr_scheduler_type="constant", save_strategy="no", save_total_limit=2,
                             report_to=[], evaluation_strategy="no")
    probe = save_stall.make_probe(every, warm)
    trainer = Trainer(model, args, train_dataset=Synthetic(max(512, batch * 64)), loss_fn=paddle.nn.MSELoss(),
                      callbacks=[probe])
    start = time.perf_counter()
    trainer.fit()
    fit_seconds = time.perf_counter() - start
    periods = save_stall.periods_of(probe)
    trainer.args.save_async = False
    ckpt = trainer.save_checkpoint()
    with open(os.path.join(ckpt, "manifest.json"), encoding="utf-8") as f:
        files = {name: meta["bytes"] for name, meta in json.load(f)["files"].items()}
    # the two halves of a save, timed apart: the copy to host memory (the async stall) and the files
    # the two halves of a save timed apart (wall and this thread's CPU): the copy to host memory (the async
    # stall), fresh arrays against the buffers kept from the last save, and the files
    snapshot_times, fresh_times, write_times = [], [], []
    try:
        from trainer.checkpoint import snapshot as ckpt_snapshot
        from trainer.checkpoint import writer as ckpt_writer
        from trainer.checkpoint.host_buffers import HostBuffers

        def timed(job, *job_args):
            t, c = time.perf_counter(), time.thread_time()
            out = job(*job_args)
            return out, (time.perf_counter() - t, time.thread_time() - c)

        buffers = HostBuffers()
        for i in range(3):  # the first fills the host buffers (a fit()'s first save); the others reuse them
            fresh, took = timed(ckpt_snapshot.snapshot, trainer)
            del fresh
            fresh_times.append(took)
            snap, took = timed(ckpt_snapshot.snapshot, trainer, buffers)
            _, wrote = timed(ckpt_writer.write_snapshot, snap, os.path.join(out_dir, f"probe-{i}"), None)
            if i:
                snapshot_times.append(took)
                write_times.append(wrote)
            buffers.release()
            del snap
    except (AttributeError, TypeError, ImportError):  # the checkpoint API moved: leave these rows empty
        snapshot_times, fresh_times, write_times = [(None, None)], [(None, None)], [(None, None)]
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
    return {"params": n_params, "hidden": hidden, "batch": batch, "every": every, "rounds": rounds,
            "periods": periods, "summary": save_stall.summarize(periods),
            "fit_seconds": fit_seconds, "files": files, "verify_s": statistics.median(verify_times),
            "load_s": statistics.median(load_times), "bare_load_s": statistics.median(bare_times),
            "load_ratios": [a / b for a, b in zip(load_times, bare_times)],
            "load_cpu_ratios": [a / b for a, b in zip(load_cpu, bare_cpu)],
            **{f"{name}_{kind}": common.median(t[k] for t in times) for name, times in
               (("snapshot", snapshot_times), ("fresh_snapshot", fresh_times[1:]), ("write", write_times))
               for k, kind in enumerate(("s", "cpu_s"))},
            "peak_rss_mb": common.peak_rss_mb()}


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
    from trainer.checkpoint.manifest import write_manifest

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
        write_manifest(ckpt, manifest)  # re-signed and re-sealed: the manifest's own digest too
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
    first = stall[0]
    lines = [f"## Checkpoint cost ({common.machine_line(info)})", "", load_line, ""]
    lines += [f"MLP of {first['params'] / 1e6:.1f} M parameters (hidden {first['hidden']}), AdamW, batch {first['batch']}; "
              f"periods of {first['every']} steps cycling no save / sync / async, {first['rounds']} rounds per load, "
              f"in one process per load; save-free step: "
              + ", ".join(f"{_ms(r['summary']['ref_step'])} ms ({r['load']})" for r in stall) + ".", ""]
    lines.append(common.markdown_table(save_stall.HEADERS, save_stall.table(stall)))
    lines.append("")
    lines.append(common.markdown_table(save_stall.RATIO_HEADERS, save_stall.ratios(stall)))
    lines.append("")
    sync = first
    files = sync["files"]
    total = sum(files.values())
    size_rows = [[name, common.fmt_size(size)] for name, size in sorted(files.items())] + [["total", common.fmt_size(total)]]
    lines.append(common.markdown_table(["checkpoint file", "size"], size_rows))
    lines.append("")
    def rate(seconds):
        return f"{total / 2 ** 20 / seconds:.0f} MiB/s" if seconds and seconds == seconds else "n/a"

    lines.append(common.markdown_table(
        ["part of a save or load", "median (ms)", "CPU of the thread (ms)", "throughput"],
        [["snapshot: copy the state to host memory into the buffers of the last save (at the step)",
          _ms(sync["snapshot_s"]), _ms(sync.get("snapshot_cpu_s")), rate(sync["snapshot_s"])],
         ["snapshot into new arrays (fresh pages; before issue 33)", _ms(sync.get("fresh_snapshot_s")),
          _ms(sync.get("fresh_snapshot_cpu_s")), rate(sync.get("fresh_snapshot_s"))],
         ["write: files hashed as written, fsync, rename (background when async)", _ms(sync["write_s"]),
          _ms(sync.get("write_cpu_s")), rate(sync["write_s"])],
         ["manifest verify (sha256 of every file)", _ms(sync["verify_s"]), "", rate(sync["verify_s"])],
         ["Trainer.load_checkpoint (read once, hashing while reading, + set)", _ms(sync["load_s"]), "", rate(sync["load_s"])],
         ["bare load of the same files (safetensors read + set_state_dict, no check)", _ms(sync.get("bare_load_s")), "",
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


def _burners(n: int) -> list:
    """``n`` CPU-burning processes: ``stress-ng --cpu n`` (one process), else Python spinners."""
    if n <= 0:
        return []
    if shutil.which("stress-ng"):
        return [subprocess.Popen(["stress-ng", "--cpu", str(n), "--quiet"], stdout=subprocess.DEVNULL)]
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main(argv=None) -> int:
    p = common.Parser(prog="python -m benchmarks checkpoint", description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=float, default=20, help="MLP parameters, in millions (default 20)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of no save / sync / async per load (default 3)")
    p.add_argument("--every", type=int, default=8, help="steps between saves (default 8)")
    p.add_argument("--batch", type=int, default=16, help="batch of the stall runs (default 16)")
    p.add_argument("--positions", default="10,1000,10000,19990", help="resume positions (default 10,1000,10000,19990)")
    p.add_argument("--epoch-samples", type=int, default=1_280_000, help="samples per epoch of the resume runs")
    p.add_argument("--resume-batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="resumes per position (default 3)")
    p.add_argument("--replay-measure", type=int, default=300, help="batches iterated to estimate replay cost")
    p.add_argument("--busy", default="0,2", help="stress-ng --cpu workers beside the stall runs, a list run in turn "
                   "(default 0,2: none, then both cores of a 2-core machine kept busy)")
    p.add_argument("--dir", type=common.existing_dir, default=None, help="where checkpoints are written (default: a temporary directory)")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--markdown", type=common.output_file, help="also write the report to this file")
    p.add_argument("--json", type=common.output_file, help="write the raw measurements to this file")
    # --child stall | resume (one measurement per process), or stall,resume: both in one process (the smoke
    # test: one paddle import instead of two), each in its own directory under --out
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    positions = [int(x) for x in common.split_list(a.positions)]
    if a.child:
        jobs = common.split_list(a.child)
        if any(kind not in ("stall", "resume") for kind in jobs):
            p.error(f"--child {a.child!r}: choose stall, resume or both")
        for kind in jobs:
            out = a.out if len(jobs) == 1 else os.path.join(a.out, kind)
            if kind == "stall":
                common.emit(child_stall(a.params, a.rounds, a.every, a.batch, out))
            else:
                common.emit(child_resume(positions, a.epoch_samples, a.resume_batch, a.repeats, a.replay_measure, out))
        return 0
    if a.rounds < 1 or a.every < 2:
        p.error("--rounds must be >= 1 and --every >= 2")
    if max(positions) >= a.epoch_samples // a.resume_batch:
        p.error(f"--positions must be below the {a.epoch_samples // a.resume_batch} steps of an epoch")

    info = common.machine_info()
    print(f"# checkpoint: {a.params:g} M parameters, {a.rounds} rounds of no save / sync / async, {a.every} steps each; "
          f"{common.machine_line(info)}", flush=True)
    root = tempfile.mkdtemp(prefix="bench-ckpt-", dir=a.dir)
    stall = []
    try:
        for busy in (int(b) for b in common.split_list(a.busy)):  # idle, then the machine kept busy, in one run
            out = os.path.join(root, f"stall-{busy}")
            cmd = [sys.executable, "-m", "benchmarks.checkpoint", "--child", "stall", "--params", str(a.params),
                   "--rounds", str(a.rounds), "--every", str(a.every), "--batch", str(a.batch), "--out", out]
            burners = _burners(busy)
            before = os.getloadavg()[0]
            try:
                res = common.run_child(cmd, timeout=a.timeout)
            finally:
                for b in burners:
                    b.kill()
                    b.wait()
            after = os.getloadavg()[0]
            res["busy"] = busy
            res["load"] = (f"{busy} x stress-ng --cpu" if busy else "no burners") + \
                f" (load average {before:.1f} -> {after:.1f})"
            stall.append(res)
            shutil.rmtree(out, ignore_errors=True)
            lost = {m: v["lost"] for m, v in res["summary"]["modes"].items()}
            print(f"  {res['load']}: fit {res['fit_seconds']:.1f} s, lost per save (s) {lost}", flush=True)
        cmd = [sys.executable, "-m", "benchmarks.checkpoint", "--child", "resume", "--positions", a.positions,
               "--epoch-samples", str(a.epoch_samples), "--resume-batch", str(a.resume_batch),
               "--repeats", str(a.repeats), "--replay-measure", str(a.replay_measure),
               "--out", os.path.join(root, "resume")]
        resume = common.run_child(cmd, timeout=a.timeout)
        print(f"  resume: {len(positions)} positions x {a.repeats}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = report(stall, resume, info, common.load_line())
    print()
    print(text)
    common.write_outputs(text, {"machine": info, "stall": stall, "resume": resume}, a.markdown, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
