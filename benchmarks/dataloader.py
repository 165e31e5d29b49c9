"""The ResNet ImageFolder input pipeline, backend by backend and image set by
image set: images per CPU-second and per second against
``dataloader_num_workers``, the ratio to Pillow's and the fraction of the
decoder-alone rate, the evaluation path's difference from Pillow's, and
(``--epochs`` > 0) the share of a training step spent waiting for data,
measured the way ``callbacks.GPUUtilizationMonitor`` does.

Data (``--sets``, :mod:`benchmarks.jpeg_sets`): ``--images`` JPEGs per set
generated at start with a fixed seed into a temporary ImageFolder tree
(``train/`` with one sub-folder per class, ``val/`` the same files). Nothing is
downloaded. ``textured``: 500x375, quality 90, a noise texture with the entropy
of real photos; ``mixed``: the same texture at ImageNet-like sizes, sides of
300-1,200 px; ``smooth``: the earlier, smoother images (~500x375).

Backends (``--backends``), all read through ``models.resnet.data.imagefolder_data``
(the bundle the task trains on: uint8 CHW out, normalized on the device),
training transform RandomResizedCrop(224) + horizontal flip:

* ``pillow``: Pillow decode + ``paddle.vision.transforms`` (the previous default);
* ``turbo``: ours, the default: batches built in place, each crop box decoded alone (nvImageCodec's
  libjpeg-turbo region decode) or at the reduced DCT scale it allows, OpenCV resize;
* ``dali``: NVIDIA DALI's CPU pipeline (when ``nvidia-dali-cuda120`` is installed);
  DALI decodes in its own threads, so its "workers" setting is its thread count
  (0 workers = 1 thread) and the loader has none.

For each image set, ``num_workers`` setting and backend, in its own process
(all settings interleaved within each of ``--repeats`` rounds, medians reported):

1. *pipeline*: one pass over the images through the loader the Trainer builds
   (``trainer.data.make_loader`` with our resumable sampler, batches of
   ``--batch``; the workers' start is measured, the decoders' imports and
   DALI's pipeline build are not): images per second, CPU seconds of the
   process and its workers (joined at the end, so their time is counted) per
   second (cores busy), and images per CPU-second, the figure that says how
   many cores a GPU's appetite costs;
2. *training* (``--epochs`` > 0): a tiny conv net (a short step, like an
   accelerator's) trained by ``trainer.Trainer`` on the bundle, the first
   step of the run and of each epoch left out (as GPUUtilizationMonitor
   does): data-wait share = wait / step time.

*Decoder alone*, per set and round, in a process of its own: images per
CPU-second of libjpeg-turbo reading and decoding whole images at full size
(fast IDCT and upsampling, nothing else): the speed a pipeline that decodes
whole images cannot beat, and the reference of "of decoder alone"; of the
region decode alone (each RandomResizedCrop box, 32 per call); of the
decoding ``turbo`` plans (the box alone, or the whole image at the reduced DCT
scale the box allows), with the share of boxes a reduced scale applies to; and
the floor of any exact decoder: each box's last row alone, which costs the
entropy decoding of every row above it (Huffman data has no random access in a
JPEG without restart markers: on photo-like images most of a decode's time).

*Evaluation path*: mean absolute difference (in 1/255) of the deterministic
evaluation crops (resize 256, center crop 224) of ``turbo`` and ``dali`` from
``pillow``'s, over the first 128 images of each set (target: within 8/255), and
each backend's images per CPU-second on them (no workers, batches of 32).

Run::

    python -m benchmarks dataloader                         # 512 images per set, workers 0,1,2, every backend
    python -m benchmarks dataloader --repeats 3             # 3 interleaved rounds
    python -m benchmarks dataloader --sets textured --workers 0 --backends pillow,turbo --epochs 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Dict, List

from benchmarks import common
from benchmarks.jpeg_sets import SETS, make_tree

BACKENDS = ("pillow", "turbo", "dali")
EVAL_IMAGES = 128


def dali_available() -> bool:
    from models.resnet.dali import dali_missing

    return dali_missing() is None


def bundle(root: str, backend: str):
    from models.resnet.data import imagefolder_data

    options = SimpleNamespace(data_dir=root, image_size=224, resize_size=256, augment=True, bad_images="skip",
                              data_backend=backend)
    return imagefolder_data(options)


def cpu_seconds() -> float:
    """User + system CPU time of this process and of its children that have ended (DataLoader workers, once joined)."""
    import resource

    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def cpu_seconds_with_live_children() -> float:
    """:func:`cpu_seconds` plus the CPU time of the children still running (kept DataLoader workers)."""
    import psutil

    live = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            times = proc.cpu_times()
        except psutil.Error:  # ended meanwhile: in RUSAGE_CHILDREN once reaped
            continue
        live += times.user + times.system
    return cpu_seconds() + live


def _tiny_convnet(classes: int):
    import paddle.nn as nn

    from models.resnet.transforms import normalize_pixels

    class Normalize(nn.Layer):  # uint8 pixels normalized on the device, as models.resnet.model.ResNet does
        def forward(self, x):
            return normalize_pixels(x)

    # cheap on purpose: an accelerator's step is short, so the input pipeline is what limits it
    return nn.Sequential(Normalize(), nn.AvgPool2D(4), nn.Conv2D(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(8, classes))


def pipeline(root: str, backend: str, workers: int, batch: int, seed: int) -> dict:
    """Two passes over the training images through the Trainer's loader with its workers kept (see the module
    docstring): the first with the workers' start, the second as every later epoch of a fit() runs."""
    from trainer.data import ResumableDistributedBatchSampler, SeededDataset, close_iterator, make_loader
    from trainer.data.loader import shutdown_workers

    dataset = bundle(root, backend).train
    loader_workers = workers
    if backend == "dali":
        dataset.threads, loader_workers = max(1, workers), 0
    sampler = ResumableDistributedBatchSampler(len(dataset), batch, shuffle=True, seed=seed, drop_last=True)
    # warm-up outside the measurement: the decoders' imports (before the workers fork) and DALI's pipeline build
    dataset.__getitems__(sampler.batch_indices(0)) if backend == "dali" else dataset[0]
    source = SeededDataset(dataset, seed) if loader_workers else dataset
    loader = make_loader(source, sampler, None, loader_workers, persistent_workers=True)
    row = {}
    try:
        for epoch, name in enumerate(("first_", "")):  # "": the kept workers' pass, the figure reported
            sampler.set_epoch(epoch)
            if hasattr(source, "set_epoch"):
                source.set_epoch(epoch)
            wall, cpu, n = time.perf_counter(), cpu_seconds_with_live_children(), 0
            it = iter(loader)  # the first pass starts the workers within the measurement
            for images, _ in it:
                n += images.shape[0]
            wall = time.perf_counter() - wall
            close_iterator(it)  # the workers are kept (persistent) for the next pass
            cpu = cpu_seconds_with_live_children() - cpu
            row.update({f"{name}pipeline_images": n, f"{name}images_per_s": n / wall, f"{name}cores_busy": cpu / wall,
                        f"{name}images_per_cpu_s": n / cpu if cpu > 0 else float("nan")})
    finally:
        shutdown_workers(loader)
    return row


def training(root: str, backend: str, workers: int, batch: int, epochs: int, seed: int) -> dict:
    import paddle

    from callbacks import Callback
    from trainer import Trainer, TrainingArguments

    class RecordWait(Callback):
        def __init__(self):
            self.wait = self.time = 0.0
            self.steps = 0
            self.skip_next = True

        def on_fit_begin(self, trainer):
            self.skip_next = True

        def on_step_end(self, trainer):
            if self.skip_next or trainer.state.step_in_epoch == 1:
                self.skip_next = False
                return
            self.wait += trainer.state.last_data_wait
            self.time += trainer.state.last_step_time
            self.steps += 1

    data = bundle(root, backend)
    if backend == "dali":
        data.train.threads, workers = max(1, workers), 0
    rec = RecordWait()
    out_dir = tempfile.mkdtemp(prefix="bench-dataloader-")
    try:
        paddle.seed(seed)
        model = _tiny_convnet(len(data.class_names))
        args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch, num_train_epochs=epochs,
                                 dataloader_num_workers=workers, dataloader_drop_last=True, report_to=[],
                                 save_strategy="no", evaluation_strategy="no", learning_rate=1e-3, seed=seed)
        Trainer(model, args, train_dataset=data.train, loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[rec]).fit()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    step_s = rec.time / max(1, rec.steps)
    return {"train_steps": rec.steps, "step_ms": 1e3 * step_s, "wait_ms": 1e3 * rec.wait / max(1, rec.steps),
            "data_wait_share": rec.wait / rec.time if rec.time else float("nan"),
            "train_images_per_s": batch / step_s if step_s else float("nan")}


def child(root: str, backend: str, workers: int, batch: int, epochs: int, seed: int) -> dict:
    common.quiet_paddle_warnings()
    import paddle

    paddle.set_device("cpu")
    row = {"backend": backend, "workers": workers, **pipeline(root, backend, workers, batch, seed)}
    if epochs > 0:
        row.update(training(root, backend, workers, batch, epochs, seed))
    row["peak_rss_mb"] = common.peak_rss_mb()
    return row


def eval_difference(root: str, backends: List[str], rounds: int = 3) -> dict:
    """The evaluation path: mean absolute difference (1/255) of each backend's evaluation crops from Pillow's
    (``vs_pillow``), and its images per CPU-second (``images_per_cpu_s``: batches of 32, this process's CPU
    time, DALI's threads included; the backends interleaved over ``rounds``, medians)."""
    common.quiet_paddle_warnings()
    import numpy as np

    crops: Dict[str, np.ndarray] = {}
    vals = {backend: bundle(root, backend).val for backend in backends}
    n = min(EVAL_IMAGES, len(vals[backends[0]]))

    def images(val, indices):
        return val.__getitems__(indices) if hasattr(val, "__getitems__") else [val[i] for i in indices]

    for backend, val in vals.items():  # also the warm-up of the speed rounds below
        crops[backend] = np.stack([np.asarray(x) for x, _ in images(val, list(range(n)))]).astype("int16")
    ref = crops["pillow"]
    diffs = {b: {"mean_abs_diff": float(np.abs(c - ref).mean()),
                 "worst_image_mean_abs_diff": float(np.abs(c - ref).reshape(len(c), -1).mean(axis=1).max())}
             for b, c in crops.items() if b != "pillow"}
    rates: Dict[str, list] = {b: [] for b in backends}
    for _ in range(rounds):
        for backend, val in vals.items():
            start = time.process_time()
            for b in range(0, n, 32):
                images(val, list(range(b, min(n, b + 32))))
            rates[backend].append(n / (time.process_time() - start))
    return {"vs_pillow": diffs, "images_per_cpu_s": {b: common.median(r) for b, r in rates.items()}}


def decoder_limit(root: str, size: int = 224) -> dict:
    """Images per CPU-second of decoding alone (see the module docstring): whole images at full size (the
    reference), each RandomResizedCrop box alone (nvImageCodec, 32 per call), and the decoding turbo plans."""
    import resource

    import numpy as np
    import simplejpeg

    from models.resnet import jpeg_regions
    from models.resnet.crops import random_resized_crop_box
    from models.resnet.turbo import TurboTransform, dct_scale, pixel_region

    folder = os.path.join(root, "train")
    paths = sorted(os.path.join(d, f) for d, _, files in os.walk(folder) for f in files)

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    start = cpu()
    for path in paths:
        simplejpeg.decode_jpeg(read(path), fastdct=True, fastupsample=True)
    row = {"decode_only_images_per_cpu_s": len(paths) / (cpu() - start)}
    np.random.seed(0)
    boxes = []
    for path in paths:
        height, width, _, _ = simplejpeg.decode_jpeg_header(read(path))
        boxes.append((height, width, random_resized_crop_box(height, width)))
    row["reduced_scale_share"] = float(np.mean([dct_scale(b[2], b[3], size) > 1 for _, _, b in boxes]))
    if not jpeg_regions.available():
        return row
    height, width, box = boxes[0]
    jpeg_regions.decode_regions([read(paths[0])], [pixel_region(box, height, width)], fast=True)  # the decoder made
    transform = TurboTransform.for_training(size)
    # the box alone; the decoding turbo plans (the box alone, or the whole image at the box's reduced DCT scale);
    # the floor of an exact decode: only the box's last row (the entropy decoding of every row above it, which no
    # JPEG without restart markers can skip, and the inverse DCT of one row of blocks)
    for key, planned, floor in (("region_decode_images_per_cpu_s", False, False),
                                ("planned_decode_images_per_cpu_s", True, False),
                                ("entropy_floor_images_per_cpu_s", False, True)):
        start = cpu()
        for b in range(0, len(paths), 32):  # 32 per call, as turbo's batches
            datas, regions = [], []
            for path, (height, width, box) in zip(paths[b:b + 32], boxes[b:b + 32]):
                if planned and dct_scale(box[2], box[3], size) > 1:
                    transform.decode_scaled(read(path), height, width, box)
                    continue
                datas.append(read(path))
                y0, x0, y1, x1 = pixel_region(box, height, width)
                regions.append((y1 - 1, x0, y1, x1) if floor else (y0, x0, y1, x1))
            jpeg_regions.decode_regions(datas, regions, fast=True)
        row[key] = len(paths) / (cpu() - start)
    return row


def summarize(runs: List[dict]) -> List[dict]:
    """Median of each (set, backend, workers) over the repeats; ratios to Pillow's at the same set and workers."""
    keys = sorted({(r["set"], r["backend"], r["workers"]) for r in runs},
                  key=lambda k: (SETS.index(k[0]), k[2], BACKENDS.index(k[1])))
    rows = []
    for key in keys:
        mine = [r for r in runs if (r["set"], r["backend"], r["workers"]) == key]
        row = {"set": key[0], "backend": key[1], "workers": key[2], "repeats": len(mine)}
        for field in mine[0]:
            if field not in row and isinstance(mine[0][field], (int, float)):
                row[field] = common.median(r[field] for r in mine)
        rows.append(row)
    for row in rows:
        ref = _row(rows, "pillow", row)
        row["cpu_s_ratio_to_pillow"] = row["images_per_cpu_s"] / ref["images_per_cpu_s"] if ref else float("nan")
        row["ratio_to_pillow"] = row["images_per_s"] / ref["images_per_s"] if ref else float("nan")
    return rows


def _row(rows: List[dict], backend: str, like: dict):
    """The row of ``backend`` at the image set and workers of ``like`` (None if not measured)."""
    where = (like["set"], like["workers"])
    return next((r for r in rows if r["backend"] == backend and (r["set"], r["workers"]) == where), None)


def limits_by_set(limits: List[dict]) -> Dict[str, dict]:
    """Median of each decoder-alone figure per image set over the rounds."""
    out: Dict[str, dict] = {}
    for name in dict.fromkeys(r["set"] for r in limits):
        mine = [r for r in limits if r["set"] == name]
        out[name] = {k: common.median(r.get(k, float("nan")) for r in mine) for k in mine[0] if k != "set"}
    return out


def report(rows: List[dict], evals: Dict[str, dict], images: int, batch: int, epochs: int, repeats: int, info: dict,
           limits: Dict[str, dict], loads: List[str]) -> str:
    """The pipeline table (set x workers: Pillow, ours, DALI CPU, decoder alone), then each set's detail."""
    def cell(r, key="images_per_cpu_s"):
        return "n/a" if r is None else common.fmt(r[key], 1)

    lines = [f"Machine: {common.machine_line(info)}; {loads[0]} at the start, {loads[-1]} at the end.",
             f"{images} generated JPEGs per set, RandomResizedCrop 224 + flip, uint8 CHW, batch {batch}; medians of "
             f"{repeats} interleaved round(s); images per CPU-second of the second pass (the loader's workers kept, as "
             "fit() keeps them from epoch to epoch), CPU time counting the loader's workers and "
             "DALI's threads; ratio to Pillow at the same set and workers; \"of decoder\": the fraction of the "
             "decoder-alone rate (whole images at full size).", ""]
    headers = ["image set", "workers", "Pillow", "ours", "ours vs Pillow", "ours of decoder", "DALI CPU",
               "DALI vs Pillow", "decoder alone"]
    table = []
    for r in rows:
        if r["backend"] != "turbo":
            continue
        pillow, dali = _row(rows, "pillow", r), _row(rows, "dali", r)
        limit = limits.get(r["set"], {}).get("decode_only_images_per_cpu_s", float("nan"))
        table.append([r["set"], r["workers"], cell(pillow), f"**{cell(r)}**", f"**{r['cpu_s_ratio_to_pillow']:.2f}x**",
                      f"{r['images_per_cpu_s'] / limit:.2f}", cell(dali),
                      "n/a" if dali is None else f"{dali['cpu_s_ratio_to_pillow']:.2f}x", common.fmt(limit, 1)])
    lines += [common.markdown_table(headers, table), ""]
    for name, lim in limits.items():
        lines.append(f"- {name}: decoder alone {common.fmt(lim.get('decode_only_images_per_cpu_s'), 1)} images per "
                     "CPU-s; each box alone (region decode) "
                     f"{common.fmt(lim.get('region_decode_images_per_cpu_s'), 1)}; "
                     f"the decoding turbo plans {common.fmt(lim.get('planned_decode_images_per_cpu_s'), 1)}; "
                     f"the floor of an exact decode (each box's last row: the entropy decoding above it) "
                     f"{common.fmt(lim.get('entropy_floor_images_per_cpu_s'), 1)}; "
                     f"a reduced DCT scale applies to {100 * lim.get('reduced_scale_share', float('nan')):.0f}% of the "
                     "boxes.")
    lines.append("")
    train = epochs > 0
    headers = ["image set", "backend", "workers", "images/s", "cores busy", "images per CPU-s", "per CPU-s vs pillow",
               "first pass per CPU-s (workers start)"]
    if train:
        headers += ["train step ms", "data wait ms/step", "data-wait share"]
    table = []
    for r in rows:
        workers = f"{r['workers']} (DALI threads {max(1, r['workers'])})" if r["backend"] == "dali" else r["workers"]
        line = [r["set"], r["backend"], workers, common.fmt(r["images_per_s"], 1), common.fmt(r["cores_busy"], 2),
                common.fmt(r["images_per_cpu_s"], 1), f"{r['cpu_s_ratio_to_pillow']:.2f}x",
                common.fmt(r["first_images_per_cpu_s"], 1)]
        if train:
            line += [common.fmt(r["step_ms"], 1), common.fmt(r["wait_ms"], 1), f"{100 * r['data_wait_share']:.1f}%"]
        table.append(line)
    lines += [common.markdown_table(headers, table), ""]
    for name, result in evals.items():
        speed = result["images_per_cpu_s"]
        lines.append(f"Evaluation path (resize 256, center crop 224), {name}, first {EVAL_IMAGES} images, against "
                     f"Pillow's ({common.fmt(speed['pillow'], 1)} images per CPU-s, no workers): " + "; ".join(
                         f"{b} {v['mean_abs_diff']:.2f}/255 mean (worst image {v['worst_image_mean_abs_diff']:.2f}), "
                         f"{common.fmt(speed[b], 1)} images per CPU-s ({speed[b] / speed['pillow']:.2f}x)"
                         for b, v in result["vs_pillow"].items()) + " (target: within 8/255).")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = common.Parser(prog="python -m benchmarks dataloader", description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=512, help="JPEGs to generate per image set (default 512)")
    p.add_argument("--sets", default="textured,mixed", help=f"image sets: {','.join(SETS)} (default textured,mixed)")
    p.add_argument("--workers", default="0,1,2", help="dataloader_num_workers settings (default 0,1,2)")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="pillow,turbo,dali (default all; dali only when installed)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=0, help="training epochs per setting (default 0: pipeline only)")
    p.add_argument("--repeats", type=int, default=1, help="interleaved rounds (default 1)")
    p.add_argument("--scale", type=float, default=1.0, help="image size factor of every set (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--markdown", type=common.output_file, help="also write the report to this file")
    p.add_argument("--json", type=common.output_file, help="write the raw measurements to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)  # the image tree
    p.add_argument("--child-backend", help=argparse.SUPPRESS)
    p.add_argument("--child-workers", type=int, help=argparse.SUPPRESS)
    p.add_argument("--child-eval", help=argparse.SUPPRESS)  # the backends to compare
    p.add_argument("--child-decoder", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child and a.child_decoder:
        common.emit(decoder_limit(a.child))
        return 0
    if a.child and a.child_eval:
        common.emit(eval_difference(a.child, common.split_list(a.child_eval)))
        return 0
    if a.child:
        common.emit(child(a.child, a.child_backend, a.child_workers, a.batch, a.epochs, a.seed))
        return 0
    if a.images < 2 * a.batch:
        p.error(f"--images must be at least 2 batches ({2 * a.batch})")
    workers = [int(w) for w in common.split_list(a.workers)]
    backends, sets = common.split_list(a.backends), common.split_list(a.sets)
    for what, given, known in (("--backends", backends, BACKENDS), ("--sets", sets, SETS)):
        unknown = [b for b in given if b not in known]
        if unknown:
            p.error(f"{what}: unknown {unknown}: choose from {', '.join(known)}")
    if "dali" in backends and not dali_available():
        print("  dali: NVIDIA DALI is not installed (pip install '.[dali]'): left out", flush=True)
        backends.remove("dali")
    if "pillow" not in backends:
        backends.insert(0, "pillow")  # the reference of every ratio
    info = common.machine_info()
    loads = [common.load_line()]
    print(f"# dataloader: sets {sets}, backends {backends}, workers {workers}; {common.machine_line(info)}; "
          f"{loads[0]}", flush=True)
    base = tempfile.mkdtemp(prefix="bench-jpegs-")
    roots = {name: os.path.join(base, name) for name in sets}
    me = [sys.executable, "-m", "benchmarks.dataloader"]
    try:
        for name, root in roots.items():
            start = time.perf_counter()
            os.makedirs(root)
            make_tree(root, a.images, seed=a.seed, scale=a.scale, kind=name)
            print(f"  {name}: generated {a.images} JPEGs in {time.perf_counter() - start:.1f} s", flush=True)
        runs, limits, evals = [], [], {}
        for _ in range(a.repeats):
            for name, root in roots.items():
                limit = common.run_child(me + ["--child", root, "--child-decoder"], timeout=a.timeout)
                limits.append({"set": name, **limit})
                for w in workers:
                    for backend in backends:
                        cmd = me + ["--child", root, "--child-backend", backend, "--child-workers", str(w),
                                    "--batch", str(a.batch), "--epochs", str(a.epochs), "--seed", str(a.seed)]
                        res = {"set": name, **common.run_child(cmd, timeout=a.timeout)}
                        runs.append(res)
                        print(f"  {name} {backend} workers {w}: {res['images_per_cpu_s']:.1f} images per CPU-s, "
                              f"{res['images_per_s']:.1f} images/s", flush=True)
        for name, root in roots.items():
            if len(backends) > 1:
                evals[name] = common.run_child(me + ["--child", root, "--child-eval", ",".join(backends)],
                                               timeout=a.timeout)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    loads.append(common.load_line())
    rows, by_set = summarize(runs), limits_by_set(limits)
    text = report(rows, evals, a.images, a.batch, a.epochs, a.repeats, info, by_set, loads)
    print()
    print(text)
    common.write_outputs(text, {"machine": info, "loads": loads, "rows": rows, "runs": runs, "limits": limits,
                                "decoder_alone": by_set, "evaluation": evals, "scale": a.scale},
                         a.markdown, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
