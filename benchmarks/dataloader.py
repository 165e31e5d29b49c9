"""The ResNet ImageFolder input pipeline, backend by backend: images per
CPU-second and per second against ``dataloader_num_workers``, the evaluation
path's difference from Pillow's, and the share of a training step spent
waiting for data, measured the way ``callbacks.GPUUtilizationMonitor`` does.

Data: ``--images`` JPEGs generated at start into a temporary ImageFolder tree
(``train/`` with one sub-folder per class, ``val/`` the same files; sizes
around ImageNet's average of ~500x375, smooth colour fields plus noise so
they compress like photographs). Nothing is downloaded.

Backends (``--backends``), all read through ``models.resnet.data.imagefolder_data``
(the bundle the task trains on: uint8 CHW out, normalized on the device),
training transform RandomResizedCrop(224) + horizontal flip:

* ``pillow``: Pillow decode + ``paddle.vision.transforms`` (the previous default);
* ``turbo``: the default: batches built in place, each crop box decoded alone (nvImageCodec's
  libjpeg-turbo region decode) or at the reduced DCT scale it allows, OpenCV resize;
* ``dali``: NVIDIA DALI's CPU pipeline (when ``nvidia-dali-cuda120`` is installed);
  DALI decodes in its own threads, so its "workers" setting is its thread count
  (0 workers = 1 thread) and the loader has none.

For each backend and ``num_workers`` setting, in its own process (settings
interleaved, ``--repeats`` rounds, medians reported):

1. *pipeline*: one pass over the images through the loader the Trainer builds
   (``trainer.data.make_loader`` with our resumable sampler, batches of
   ``--batch``; the workers' start is measured, as every epoch pays it, the
   decoders' imports and DALI's pipeline build are not): images per second,
   CPU seconds of the process and its workers (joined at the end, so their
   time is counted) per second (cores busy), and images per CPU-second, the
   figure that says how many cores a GPU's appetite costs;
2. *training* (``--epochs`` > 0): a tiny conv net (a short step, like an
   accelerator's) trained by ``trainer.Trainer`` on the bundle, the first
   step of the run and of each epoch left out (as GPUUtilizationMonitor
   does): data-wait share = wait / step time.

*Decoder limit*: images per CPU-second of libjpeg-turbo alone on the same
files (read + full-size decode, nothing else): the speed a pipeline that
decodes whole images cannot beat; and of the region decode alone (each
image's RandomResizedCrop box, 32 per call), the limit of ``turbo``'s own
decoding. On ~500x375 images a 224 crop is rarely small enough for a
reduced DCT scale; ``--scale 2`` (~1000x750 photos) shows it at work.

*Evaluation path*: mean absolute difference (in 1/255) of the deterministic
evaluation crops (resize 256, center crop 224) of ``turbo`` and ``dali`` from
``pillow``'s, over the first 128 images (target: within 8/255).

Run::

    python -m benchmarks dataloader                        # 512 images, workers 0,2, every backend: a few minutes
    python -m benchmarks dataloader --repeats 3 --epochs 0 # pipeline only, 3 interleaved rounds
    python -m benchmarks dataloader --images 2048 --workers 0,2,4 --backends pillow,turbo
    python -m benchmarks dataloader --scale 2 --epochs 0     # ~1000x750 photos
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

BACKENDS = ("pillow", "turbo", "dali")
EVAL_IMAGES = 128


def generate_jpegs(root: str, count: int, classes: int = 4, seed: int = 0, scale: float = 1.0) -> List[str]:
    """``count`` JPEGs under ``root/class_<k>/`` (~500x375 times ``scale``); returns their paths."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(seed)
    big_h, big_w = int(600 * scale), int(800 * scale)
    noise = rng.normal(0, 12, size=(big_h, big_w, 3)).astype("float32")  # cropped at random offsets per image
    paths = []
    for k in range(classes):
        os.makedirs(os.path.join(root, f"class_{k}"), exist_ok=True)
    for i in range(count):
        h, w = int(rng.randint(300, 450) * scale), int(rng.randint(400, 600) * scale)
        yy, xx = np.mgrid[0:h, 0:w].astype("float32") / scale
        base = rng.uniform(0, 255, size=3)
        slope = rng.uniform(-0.4, 0.4, size=(3, 2))
        img = np.stack([base[c] + slope[c, 0] * yy + slope[c, 1] * xx for c in range(3)], axis=2)
        y0, x0 = int(rng.randint(0, big_h - h + 1)), int(rng.randint(0, big_w - w + 1))
        img += noise[y0:y0 + h, x0:x0 + w]
        path = os.path.join(root, f"class_{i % classes}", f"img_{i:05d}.jpg")
        Image.fromarray(np.clip(img, 0, 255).astype("uint8")).save(path, quality=90)
        paths.append(path)
    return paths


def make_tree(root: str, count: int, seed: int = 0, scale: float = 1.0) -> None:
    """``root/train/class_k/*.jpg`` and ``root/val`` (a link to the same files)."""
    generate_jpegs(os.path.join(root, "train"), count, seed=seed, scale=scale)
    os.symlink("train", os.path.join(root, "val"))


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
    """One pass over the training images through the Trainer's loader (see the module docstring)."""
    from trainer.data import ResumableDistributedBatchSampler, SeededDataset, close_iterator, make_loader

    dataset = bundle(root, backend).train
    loader_workers = workers
    if backend == "dali":
        dataset.threads, loader_workers = max(1, workers), 0
    sampler = ResumableDistributedBatchSampler(len(dataset), batch, shuffle=True, seed=seed, drop_last=True)
    # warm-up outside the measurement: the decoders' imports (before the workers fork) and DALI's pipeline build
    dataset.__getitems__(sampler.batch_indices(0)) if backend == "dali" else dataset[0]
    source = SeededDataset(dataset, seed) if loader_workers else dataset
    wall, cpu, n = time.perf_counter(), cpu_seconds(), 0
    it = iter(make_loader(source, sampler, None, loader_workers))  # workers start within the measurement
    for images, _ in it:
        n += images.shape[0]
    wall = time.perf_counter() - wall
    close_iterator(it)  # joins the workers: their CPU time is in RUSAGE_CHILDREN from here on
    cpu = cpu_seconds() - cpu
    return {"pipeline_images": n, "images_per_s": n / wall, "cores_busy": cpu / wall,
            "images_per_cpu_s": n / cpu if cpu > 0 else float("nan")}


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


def eval_difference(root: str, backends: List[str]) -> dict:
    """Mean absolute difference (1/255) of each backend's evaluation crops from Pillow's."""
    common.quiet_paddle_warnings()
    import numpy as np

    crops: Dict[str, np.ndarray] = {}
    for backend in backends:
        val = bundle(root, backend).val
        n = min(EVAL_IMAGES, len(val))
        samples = val.__getitems__(list(range(n))) if hasattr(val, "__getitems__") else [val[i] for i in range(n)]
        crops[backend] = np.stack([np.asarray(x) for x, _ in samples]).astype("int16")
    ref = crops["pillow"]
    return {b: {"mean_abs_diff": float(np.abs(c - ref).mean()),
                "worst_image_mean_abs_diff": float(np.abs(c - ref).reshape(len(c), -1).mean(axis=1).max())}
            for b, c in crops.items() if b != "pillow"}


def decoder_limit(root: str) -> dict:
    """Images per CPU-second of libjpeg-turbo alone: read + full-size decode (fast IDCT and upsampling, as the
    turbo training path), no crop, resize or batching: what a pipeline that decodes whole images cannot beat."""
    import resource

    import simplejpeg

    folder = os.path.join(root, "train")
    paths = sorted(os.path.join(d, f) for d, _, files in os.walk(folder) for f in files)

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    start = cpu()
    for path in paths:
        with open(path, "rb") as f:
            simplejpeg.decode_jpeg(f.read(), fastdct=True, fastupsample=True)
    row = {"decode_only_images_per_cpu_s": len(paths) / (cpu() - start)}
    from models.resnet import jpeg_regions
    from models.resnet.crops import random_resized_crop_box
    from models.resnet.turbo import pixel_region

    if jpeg_regions.available():  # the same files, only each RandomResizedCrop box decoded, 32 per call
        import numpy as np

        np.random.seed(0)
        jpeg_regions.decode_regions([], [], fast=True)
        start = cpu()
        for b in range(0, len(paths), 32):
            datas, regions = [], []
            for path in paths[b:b + 32]:
                with open(path, "rb") as f:
                    datas.append(f.read())
                height, width, _, _ = simplejpeg.decode_jpeg_header(datas[-1])
                regions.append(pixel_region(random_resized_crop_box(height, width), height, width))
            jpeg_regions.decode_regions(datas, regions, fast=True)
        row["region_decode_images_per_cpu_s"] = len(paths) / (cpu() - start)
    return row


def summarize(runs: List[dict]) -> List[dict]:
    """Median of each (backend, workers) over the repeats; ratios to Pillow's at the same workers."""
    keys = sorted({(r["backend"], r["workers"]) for r in runs}, key=lambda k: (k[1], BACKENDS.index(k[0])))
    rows = []
    for backend, workers in keys:
        mine = [r for r in runs if (r["backend"], r["workers"]) == (backend, workers)]
        row = {"backend": backend, "workers": workers, "repeats": len(mine)}
        for field in mine[0]:
            if field not in row and isinstance(mine[0][field], (int, float)):
                row[field] = common.median(r[field] for r in mine)
        rows.append(row)
    for row in rows:
        ref = next((r for r in rows if r["backend"] == "pillow" and r["workers"] == row["workers"]), None)
        row["cpu_s_ratio_to_pillow"] = row["images_per_cpu_s"] / ref["images_per_cpu_s"] if ref else float("nan")
        row["ratio_to_pillow"] = row["images_per_s"] / ref["images_per_s"] if ref else float("nan")
    return rows


def report(rows: List[dict], evals: dict, images: int, batch: int, epochs: int, repeats: int, info: dict,
           limit: float = float("nan"), scale: float = 1.0, region: float = float("nan")) -> str:
    train = epochs > 0
    headers = ["backend", "workers", "images/s", "cores busy", "images per CPU-s", "per CPU-s vs pillow"]
    if train:
        headers += ["train step ms", "data wait ms/step", "data-wait share"]
    table = []
    for r in rows:
        workers = f"{r['workers']} (DALI threads {max(1, r['workers'])})" if r["backend"] == "dali" else r["workers"]
        line = [r["backend"], workers, common.fmt(r["images_per_s"], 1), common.fmt(r["cores_busy"], 2),
                common.fmt(r["images_per_cpu_s"], 1), f"{r['cpu_s_ratio_to_pillow']:.2f}x"]
        if train:
            line += [common.fmt(r["step_ms"], 1), common.fmt(r["wait_ms"], 1), f"{100 * r['data_wait_share']:.1f}%"]
        table.append(line)
    lines = [
        f"Machine: {common.machine_line(info)}; {common.load_line()} at the end of the run.",
        f"{images} generated JPEGs (~{int(500 * scale)}x{int(375 * scale)}), RandomResizedCrop 224 + flip, uint8 CHW, "
        f"batch {batch}; "
        f"medians of {repeats} interleaved round(s); CPU time counts the loader's workers and DALI's threads.",
        "", common.markdown_table(headers, table), "",
        f"The decoder alone (libjpeg-turbo, whole images at full size, fast IDCT; read + decode, nothing else): "
        f"{limit:.1f} images per CPU-s; decoding only each RandomResizedCrop box (nvImageCodec's libjpeg-turbo, "
        f"32 per call, as turbo's batches do): {region:.1f} (medians of the rounds).", ""]
    if evals:
        lines += ["Evaluation path (resize 256, center crop 224) against Pillow's, first "
                  f"{EVAL_IMAGES} images: " + "; ".join(
                      f"{b} {v['mean_abs_diff']:.2f}/255 mean (worst image {v['worst_image_mean_abs_diff']:.2f})"
                      for b, v in evals.items()) + " (target: within 8/255).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks dataloader", description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=512, help="JPEGs to generate (default 512)")
    p.add_argument("--workers", default="0,2", help="dataloader_num_workers settings (default 0,2)")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="pillow,turbo,dali (default all; dali only when installed)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2, help="training epochs per setting (default 2; 0: pipeline only)")
    p.add_argument("--repeats", type=int, default=1, help="interleaved rounds (default 1)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="image size factor (default 1: ~500x375, ImageNet's average; 2: ~1000x750 photos)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--markdown", help="also write the report to this file")
    p.add_argument("--json", help="write the raw measurements to this file")
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
    backends = common.split_list(a.backends)
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        p.error(f"--backends: unknown {unknown}: choose from {', '.join(BACKENDS)}")
    if "dali" in backends and not dali_available():
        print("  dali: NVIDIA DALI is not installed (pip install '.[dali]'): left out", flush=True)
        backends.remove("dali")
    if "pillow" not in backends:
        backends.insert(0, "pillow")  # the reference of every ratio
    info = common.machine_info()
    print(f"# dataloader: backends {backends}, workers {workers}; {common.machine_line(info)}", flush=True)
    root = tempfile.mkdtemp(prefix="bench-jpegs-")
    try:
        start = time.perf_counter()
        make_tree(root, a.images, seed=a.seed, scale=a.scale)
        print(f"  generated {a.images} JPEGs in {time.perf_counter() - start:.1f} s", flush=True)
        runs, limits = [], []
        for _ in range(a.repeats):
            limits.append(common.run_child([sys.executable, "-m", "benchmarks.dataloader", "--child", root,
                                            "--child-decoder"], timeout=a.timeout))
            for w in workers:
                for backend in backends:
                    cmd = [sys.executable, "-m", "benchmarks.dataloader", "--child", root, "--child-backend", backend,
                           "--child-workers", str(w), "--batch", str(a.batch), "--epochs", str(a.epochs),
                           "--seed", str(a.seed)]
                    res = common.run_child(cmd, timeout=a.timeout)
                    runs.append(res)
                    print(f"  {backend} workers {w}: {res['images_per_cpu_s']:.1f} images per CPU-s, "
                          f"{res['images_per_s']:.1f} images/s", flush=True)
        evals = {}
        if len(backends) > 1:
            evals = common.run_child([sys.executable, "-m", "benchmarks.dataloader", "--child", root,
                                      "--child-eval", ",".join(backends)], timeout=a.timeout)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = summarize(runs)
    limit = common.median(r["decode_only_images_per_cpu_s"] for r in limits)
    region = common.median(r.get("region_decode_images_per_cpu_s", float("nan")) for r in limits)
    text = report(rows, evals, a.images, a.batch, a.epochs, a.repeats, info, limit, a.scale, region)
    print()
    print(text)
    common.write_outputs(text, {"machine": info, "rows": rows, "runs": runs, "eval_vs_pillow": evals,
                                "decode_only_images_per_cpu_s": limit, "region_decode_images_per_cpu_s": region,
                                "scale": a.scale},
                         a.markdown, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
