"""GPU day-one check: what the CPU test suite cannot prove, measured on a real GPU in a few minutes.

Run on a machine with paddlepaddle-gpu and one or more GPUs::

    python benchmarks/gpu_check.py                 # every check; a pass/fail table at the end
    python benchmarks/gpu_check.py --only amp,export --json gpu_check.json

Checks (each PASS, FAIL or SKIP with the reason and the numbers measured):

- ``card_per_rank``: under ``paddle.distributed.launch --devices`` each rank trains on
  the card the launcher gave it (``FLAGS_selected_gpus``), before and after
  ``init_parallel_env``; ``device: cpu`` with 2 processes stays on the CPU (gloo).
- ``amp``: a ResNet-18 on the embedded digits, 60 steps with ``max_grad_norm`` 1.0,
  in float32 and AMP fp16/bf16 at O1 and O2 (bf16 where the card supports it):
  every run finishes, its eval accuracy is within 0.05 of float32's and its
  predictions come back as float32 values.
- ``loss_scaling``: fp16 with an initial loss scale of 2**24: the first steps
  overflow and are skipped, the scale backs off, training goes on.
- ``nccl_allreduce``: bus bandwidth of NCCL all-reduce across all visible cards
  (``benchmarks/allreduce.py``; needs 2+ cards).
- ``nvml``: the monitor's NVML reader finds this process's card by its PCI bus id
  and reads plausible figures (needs ``pip install nvidia-ml-py``).
- ``export``: the float32 and the O2 fp16 ResNet export, checked by a predictor on
  the training card within the GPU tolerance; the measured difference is shown.
- ``cuda_rng_resume``: a run with dropout saved at step 6 and resumed ends bitwise
  equal to the uninterrupted run; the checkpoint holds this card's CUDA generator.
- ``dali``: ``--data_backend dali`` on the first GPU: the "mixed" decode (nvJPEG) of
  256 generated JPEGs gives batches on that card (paddle tensors over DLPack), its
  evaluation crops are within 8/255 mean absolute difference of DALI's CPU decode
  of the same boxes, and its images/s are shown next to the CPU pipeline's (SKIP
  without ``pip install '.[dali]'``).
- ``oom_retry``: ``auto_find_batch_size`` on the card: paddle's GPU allocator capped by
  ``FLAGS_gpu_memory_limit_mb`` fails for real (its BadAlloc arrives as ``MemoryError``), the
  micro-batch halves until the step fits, and the parameters end within 1e-5 of an uncapped run of
  the same global batch; ``skip_memory_metrics=False`` logs paddle's peak allocated/reserved MiB
  (``tests/distributed/workers/oom_toy.py``, the worker the CPU test runs under RLIMIT_AS).
- ``sharding``, ``sharding_offload_amp``: sharding stages 1/2/3 (+ recompute, offload, AMP O2, master
  gradients) on 2 cards against one card, unshimmed (``benchmarks/gpu_sharding.py``; 2+ cards).
- ``tensor_parallel``: tensor parallel 2 (and dp 2 x mp 2 on 4 cards) against one card, unshimmed: NCCL's
  in-stream all-reduce, the c_identity kernel (``benchmarks/gpu_tensor_parallel.py``; 2+ cards).
- ``pipeline_parallel``, ``pipeline_parallel_failure``: 2 stages over 2 and 4 micro-batches (and dp 2 x pp 2 on 4
  cards) against one card, unshimmed: NCCL's point-to-point calls, the launcher's device id; a killed stage ends
  the job within a bound with a restartable code (``benchmarks/gpu_pipeline_parallel.py``; 2+ cards).

Without a GPU it says so and exits 0 (the CPU test suite covers the rest).
Exit status: 0 when nothing failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks import common  # noqa: E402 - after the repository is on sys.path
from benchmarks import gpu_sharding  # noqa: E402
from benchmarks import gpu_tensor_parallel  # noqa: E402
from benchmarks import gpu_pipeline_parallel  # noqa: E402


@dataclass
class Row:
    check: str
    result: str      # PASS | FAIL | SKIP
    detail: str
    seconds: float = 0.0


def gpu_count() -> int:
    import paddle

    if not paddle.device.is_compiled_with_cuda():
        return 0
    return paddle.device.cuda.device_count()


# ---- launcher worker: which card does each rank use ---------------------------------------------
def card_worker(out_dir: str, device: str) -> None:
    import paddle

    from trainer import distributed as dist

    place = dist.select_device(device)
    before = str(paddle.ones([1]).place)
    dist.init_distributed()
    after = str(paddle.ones([1]).place)
    total = dist.all_reduce_sum(paddle.ones([1]))
    record = {"rank": dist.get_rank(), "flags": os.environ.get("FLAGS_selected_gpus"), "place": place,
              "before": before, "after": after, "sum": float(total.numpy().reshape(-1)[0]), "backend": os.environ.get("PADDLE_DISTRI_BACKEND")}
    with open(os.path.join(out_dir, f"card.{dist.get_rank()}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f)


def _launch_cards(devices: Optional[str], nproc: Optional[int], device: str) -> List[dict]:
    with tempfile.TemporaryDirectory(prefix="gpu-check-card-", ignore_cleanup_errors=True) as out:
        return _cards_in(out, devices, nproc, device)


def _cards_in(out: str, devices: Optional[str], nproc: Optional[int], device: str) -> List[dict]:
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--log_dir", os.path.join(out, "log")]
    cmd += ["--devices", devices] if devices else []
    cmd += ["--nproc_per_node", str(nproc)] if nproc else []
    cmd += [os.path.abspath(__file__), "--card-worker", out, device]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"launch exited {proc.returncode}: {proc.stderr[-500:]}")
    rows = []
    for name in sorted(os.listdir(out)):
        if name.startswith("card."):
            with open(os.path.join(out, name), encoding="utf-8") as f:
                rows.append(json.load(f))
    return rows


def check_card_per_rank(n: int) -> Row:
    ids = [str(n - 2), str(n - 1)] if n >= 3 else [str(i) for i in range(min(n, 2))]
    ranks = _launch_cards(",".join(ids), None, "auto")
    problems = []
    for r in ranks:
        want = f"gpu:{ids[r['rank']]}" if len(ids) > 1 else f"gpu:{ids[0]}"
        seen = {r["place"], r["before"].replace("Place(", "").rstrip(")"), r["after"].replace("Place(", "").rstrip(")")}
        if seen != {want}:
            problems.append(f"rank {r['rank']}: wanted {want}, saw {sorted(seen)}")
    # device: cpu while the launcher hands out cards (a paddle-gpu build would otherwise pick NCCL and a card)
    cpu = _launch_cards("0,1", None, "cpu") if n >= 2 else []
    for r in cpu:
        if "cpu" not in r["before"].lower() or "cpu" not in r["after"].lower() or r["sum"] != 2.0:
            problems.append(f"device cpu rank {r['rank']}: {r['before']} -> {r['after']}, sum {r['sum']}")
    detail = f"--devices {','.join(ids)} -> " + ", ".join(f"rank {r['rank']} {r['place']}" for r in ranks)
    if cpu:
        detail += f"; device cpu with --devices 0,1 -> {', '.join(r['after'] for r in cpu)} ({cpu[0]['backend']})"
    return Row("card_per_rank", "FAIL" if problems or not ranks else "PASS", "; ".join(problems) or detail)


# ---- training checks -------------------------------------------------------------------------
def _digits():
    from models.resnet.data import digits_data
    from models.resnet.task import ResNetOptions

    return digits_data(ResNetOptions(depth=18))


def _trainer(out: str, data, amp: str = "off", level: str = "O1", steps: int = 60, callbacks=(), dropout=False,
             **kw):
    import paddle

    from models.resnet.metrics import metrics_fn
    from models.resnet.model import build_resnet
    from trainer import Trainer, TrainingArguments

    paddle.seed(0)
    model = build_resnet(18, 10)
    if dropout:
        model.fc = paddle.nn.Sequential(paddle.nn.Dropout(0.3), model.fc)
    values = dict(output_dir=out, per_device_train_batch_size=64, per_device_eval_batch_size=128, max_steps=steps,
                  learning_rate=1e-3, amp=amp, amp_level=level, max_grad_norm=1.0, logging_steps=10,
                  evaluation_strategy="no", save_strategy="no", report_to=[], seed=0)
    values.update(kw)
    return Trainer(model, TrainingArguments(**values), train_dataset=data.train, eval_dataset=data.val,
                   loss_fn=paddle.nn.CrossEntropyLoss(), compute_metrics=metrics_fn(5), callbacks=list(callbacks))


def check_amp(tmp: str) -> Row:
    import numpy as np
    import paddle

    data = _digits()
    configs = [("float32", "off", "O1"), ("fp16-O1", "fp16", "O1"), ("fp16-O2", "fp16", "O2")]
    if paddle.amp.is_bfloat16_supported():
        configs += [("bf16-O1", "bf16", "O1"), ("bf16-O2", "bf16", "O2")]
    results, problems = {}, []
    for name, amp, level in configs:
        try:
            trainer = _trainer(os.path.join(tmp, name), data, amp, level)
            trainer.fit()
            metrics = trainer.evaluate()
            preds = trainer.predict(data.test).predictions
            if preds.dtype != np.float32 or not np.isfinite(preds).all():
                problems.append(f"{name}: predictions {preds.dtype}, finite={np.isfinite(preds).all()}")
            results[name] = metrics["eval_accuracy"]
        except Exception as exc:  # noqa: BLE001 - a check reports, it does not stop the others
            problems.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    base = results.get("float32")
    for name, acc in results.items():
        if base is not None and abs(acc - base) > 0.05:
            problems.append(f"{name}: eval_accuracy {acc:.3f} vs float32 {base:.3f}")
    note = "" if paddle.amp.is_bfloat16_supported() else " (bf16 not supported on this card: not run)"
    detail = "eval_accuracy " + ", ".join(f"{k} {v:.3f}" for k, v in results.items()) + note
    return Row("amp", "FAIL" if problems else "PASS", "; ".join(problems) + (" | " if problems else "") + detail)


def check_loss_scaling(tmp: str) -> Row:
    import math

    from callbacks.amp import AMP

    steps = 40
    amp = AMP(dtype="float16", level="O1", init_loss_scaling=2.0 ** 24)  # gradients x 2^24 overflow float16
    trainer = _trainer(os.path.join(tmp, "scaling"), _digits(), steps=steps, callbacks=[amp], logging_steps=1)
    state = trainer.fit()
    if trainer.grad_scaler is None:
        return Row("loss_scaling", "FAIL", "AMP fp16 installed no loss scaler on this device")
    losses = [r["loss"] for r in state.log_history if "loss" in r]
    scale = trainer.grad_scaler.get_loss_scaling()
    ok = 1 <= amp.skipped_steps < steps // 2 and all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    detail = (f"skipped {amp.skipped_steps} of {steps} steps, loss scale 2^24 -> {scale:g}, "
              f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return Row("loss_scaling", "PASS" if ok else "FAIL", detail)


def check_nccl(n: int) -> Row:
    if n < 2:
        return Row("nccl_allreduce", "SKIP", "one GPU: no collective to measure")
    from benchmarks import allreduce

    ns = argparse.Namespace(nproc=n, min_size="1M", max_size="256M", workloads="", seed=0, sync_steps=None,
                            rounds=None, timeout=600)
    result = allreduce.launch(ns)
    rows = result["collectives"]
    best = max(rows, key=lambda r: r["busbw_gbps"])
    ok = result["backend"] == "nccl" and best["busbw_gbps"] > 1.0
    return Row("nccl_allreduce", "PASS" if ok else "FAIL",
               f"{n} cards, {result['backend']}: bus bandwidth {best['busbw_gbps']:.1f} GB/s at {best['bytes'] >> 20} MiB")


def check_nvml() -> Row:
    import paddle

    from callbacks.gpu_monitor import NvmlReader

    try:
        import pynvml  # noqa: F401
    except ImportError:
        return Row("nvml", "SKIP", "pynvml missing: pip install nvidia-ml-py")
    device = paddle.get_device()
    reader = NvmlReader(device)
    try:
        paddle.ones([1024, 1024]).sum()  # something on the card
        figures = reader.sample()
    finally:
        reader.close()
    i = device.partition(":")[2] or "0"
    total, used, util = (figures.get(f"gpu{i}_{k}") for k in ("mem_total_mb", "mem_used_mb", "util"))
    ok = bool(total and used is not None and 0 < used <= total and 0 <= util <= 100)
    name = paddle.device.cuda.get_device_properties(int(i)).name
    return Row("nvml", "PASS" if ok else "FAIL",
               f"{device} = bus {reader.bus_id} ({name}): util {util}%, memory {used:.0f}/{total:.0f} MB")


def check_export(tmp: str) -> Row:
    data = _digits()
    details, problems = [], []
    for name, amp, level in (("float32", "off", "O1"), ("fp16-O2", "fp16", "O2")):
        try:
            trainer = _trainer(os.path.join(tmp, f"export-{name}"), data, amp, level, steps=10)
            trainer.fit()
            path = trainer.export()
            with open(os.path.join(path, "export.json"), encoding="utf-8") as f:
                report = json.load(f)
            details.append(f"{name} on {report['device']}: max diff {report['max_abs_diff']:.2g} (rtol {report['rtol']:g})")
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return Row("export", "FAIL" if problems else "PASS", "; ".join(problems + details))


def check_rng_resume(tmp: str) -> Row:
    import numpy as np

    data = _digits()
    common = dict(steps=12, dropout=True, save_steps=6, save_strategy="steps")
    full = _trainer(os.path.join(tmp, "rng-full"), data, **common)
    full.fit()
    part = os.path.join(tmp, "rng-part")
    _trainer(part, data, **common).fit()
    resumed = _trainer(part, data, **common)
    resumed.fit(resume_from_checkpoint=os.path.join(part, "checkpoints", "step-6"))
    a, b = full.model.state_dict(), resumed.model.state_dict()
    differ = [k for k in a if not np.array_equal(a[k].numpy(), b[k].numpy())]
    with open(os.path.join(part, "checkpoints", "step-6", "trainer.json"), encoding="utf-8") as f:
        meta = json.load(f)
    cuda = (meta.get("rng_per_rank") or [{}])[0].get("paddle_cuda")
    ok = not differ and cuda is not None
    detail = f"bitwise equal after resume; checkpoint holds the CUDA generator of {cuda['device']}" if ok else \
        f"{len(differ)} tensors differ ({differ[:3]}); CUDA generator saved: {cuda is not None}"
    return Row("cuda_rng_resume", "PASS" if ok else "FAIL", detail)


def check_dali(tmp: str) -> Row:
    import numpy as np

    from benchmarks.jpeg_sets import generate_jpegs
    from models.resnet.dali import DaliImageFolder, dali_missing, default_threads
    from models.resnet.turbo import TurboTransform

    missing = dali_missing()
    if missing:
        return Row("dali", "SKIP", f"NVIDIA DALI not installed ({missing}): pip install '.[dali]'")
    root = os.path.join(tmp, "dali-jpegs")
    generate_jpegs(root, 256)
    batches = [list(range(i, i + 64)) for i in range(0, 256, 64)]
    speed, first = {}, {}
    for device in ("mixed", "cpu"):
        ds = DaliImageFolder(root, TurboTransform.for_evaluation(224, 256), device=device)
        first[device] = ds.__getitems__(batches[0])  # builds the pipeline, warms nvJPEG up
        start = time.perf_counter()
        for b in batches:
            ds.__getitems__(b)
        speed[device] = 256 / (time.perf_counter() - start)
    place = str(first["mixed"][0][0].place)
    gpu = np.stack([np.asarray(x.numpy()) for x, _ in first["mixed"]]).astype("int32")
    cpu = np.stack([x for x, _ in first["cpu"]]).astype("int32")
    mad = float(np.abs(gpu - cpu).mean())
    ok = "gpu" in place.lower() and mad <= 8
    return Row("dali", "PASS" if ok else "FAIL",
               f"mixed decode: batches on {place}, {speed['mixed']:.0f} images/s vs DALI CPU {speed['cpu']:.0f} "
               f"images/s ({default_threads()} threads); "
               f"eval crops differ from the CPU decode by {mad:.2f}/255 on average (limit 8)")


def check_oom_retry(tmp: str) -> Row:
    import numpy as np

    worker = os.path.join(REPO, "tests", "distributed", "workers", "oom_toy.py")
    runs = {}
    for name, cap in (("free", None), ("capped", "1500")):
        out = os.path.join(tmp, f"oom-{name}")
        os.makedirs(out, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=REPO, OOM_TOY_MEMORY_METRICS="1")
        if cap:
            env["FLAGS_gpu_memory_limit_mb"] = cap  # paddle's own allocator cap on the card
        proc = subprocess.run([sys.executable, worker, out, "0", "-1", "65536", "1", "3", "1"], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            return Row("oom_retry", "FAIL", f"{name} run exited {proc.returncode}: {proc.stderr[-300:]}")
        with open(os.path.join(out, "result-rank0.json"), encoding="utf-8") as f:
            meta = json.load(f)
        runs[name] = (meta, dict(np.load(os.path.join(out, "params-rank0.npz"))))
    (free, p_free), (capped, p_capped) = runs["free"], runs["capped"]
    diff = max(float(np.abs(p_free[k] - p_capped[k]).max()) for k in p_free)
    peaks = capped.get("peak_gpu_allocated_mb")
    ok = capped["micro_batch"] < 65536 and capped["global_batch"] == free["global_batch"] and diff <= 1e-5 and peaks
    return Row("oom_retry", "PASS" if ok else "FAIL",
               f"micro-batch 65536 -> {capped['micro_batch']} under a 1500 MiB cap; global batch "
               f"{capped['global_batch']} (uncapped {free['global_batch']}); max parameter difference {diff:.2e}; "
               f"peak allocated {peaks} MiB")


# ---- driver ----------------------------------------------------------------------------------------
CHECKS: Dict[str, Callable[[int, str], Row]] = {
    "card_per_rank": lambda n, tmp: check_card_per_rank(n),
    "amp": lambda n, tmp: check_amp(tmp),
    "loss_scaling": lambda n, tmp: check_loss_scaling(tmp),
    "nccl_allreduce": lambda n, tmp: check_nccl(n),
    "nvml": lambda n, tmp: check_nvml(),
    "export": lambda n, tmp: check_export(tmp),
    "cuda_rng_resume": lambda n, tmp: check_rng_resume(tmp),
    "dali": lambda n, tmp: check_dali(tmp),
    "oom_retry": lambda n, tmp: check_oom_retry(tmp),
    "sharding": lambda n, tmp: Row("sharding", *gpu_sharding.check_sharding(n, tmp)),
    "sharding_offload_amp": lambda n, tmp: Row("sharding_offload_amp", *gpu_sharding.check_offload_amp(n, tmp)),
    "tensor_parallel": lambda n, tmp: Row("tensor_parallel", *gpu_tensor_parallel.check_tensor_parallel(n, tmp)),
    "pipeline_parallel": lambda n, tmp: Row("pipeline_parallel", *gpu_pipeline_parallel.check_pipeline_parallel(n, tmp)),
    "pipeline_parallel_failure": lambda n, tmp: Row("pipeline_parallel_failure",
                                                    *gpu_pipeline_parallel.check_pipeline_failure(n, tmp)),
}


def table(rows: List[Row]) -> str:
    width = max(len(r.check) for r in rows)
    lines = [f"{'check'.ljust(width)}  result  seconds  detail"]
    for r in rows:
        lines.append(f"{r.check.ljust(width)}  {r.result.ljust(6)}  {r.seconds:7.1f}  {r.detail}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = common.Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help=f"comma-separated checks (default all): {', '.join(CHECKS)}")
    p.add_argument("--json", type=common.output_file, help="also write the rows to this file")
    p.add_argument("--card-worker", nargs=2, metavar=("OUT", "DEVICE"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.card_worker:
        card_worker(*a.card_worker)
        return 0
    import logging

    logging.basicConfig(level=logging.WARNING)
    n = gpu_count()
    if n == 0:
        import paddle

        print(f"gpu_check: no GPU here (paddle {paddle.__version__}, compiled with CUDA: "
              f"{paddle.device.is_compiled_with_cuda()}); nothing to check. Run it on a machine with "
              "paddlepaddle-gpu and a GPU; the CPU test suite covers the rest.")
        return 0
    names = [s.strip() for s in a.only.split(",")] if a.only else list(CHECKS)
    unknown = [s for s in names if s not in CHECKS]
    if unknown:
        print(f"gpu_check: unknown check(s) {unknown}: choose from {', '.join(CHECKS)}", file=sys.stderr)
        return 2
    from trainer import distributed as dist

    dist.select_device("gpu")
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for name in names:
            start = time.perf_counter()
            try:
                row = CHECKS[name](n, tmp)
            except Exception as exc:  # noqa: BLE001 - report and go on
                row = Row(name, "FAIL", f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
                traceback.print_exc()
            row.seconds = time.perf_counter() - start
            rows.append(row)
            print(f"[{row.result}] {name} ({row.seconds:.0f} s): {row.detail}", flush=True)
    print()
    print(table(rows))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    return 1 if any(r.result == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
