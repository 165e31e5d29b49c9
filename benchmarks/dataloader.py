"""Images per second of the ResNet input pipeline against
``dataloader_num_workers``, and the share of a training step spent waiting
for data, measured the way ``callbacks.GPUUtilizationMonitor`` does.

Data: ``--images`` JPEGs generated at start into a temporary folder (one
sub-folder per class, sizes around ImageNet's average of ~500x375, smooth
colour fields plus noise so they compress like photographs). Nothing is
downloaded.

Pipeline (per image): PIL decode, ``paddle.vision.transforms``
RandomResizedCrop(224), RandomHorizontalFlip, HWC->CHW, Normalize (ImageNet
mean/std), collated into batches of 32 by ``paddle.io.DataLoader``.

For each ``num_workers`` setting, in its own process:

1. *pipeline*: one pass over the images through the DataLoader alone; images/s
   after the first batch (which pays for starting the workers);
2. *training*: a tiny conv net (4x4 average pooling, one 3x3/2 convolution,
   pooling, a linear layer: a short step, like an accelerator's) trained by ``trainer.Trainer`` with ``dataloader_num_workers`` set,
   two epochs; a recording callback sums ``state.last_data_wait`` and
   ``state.last_step_time`` at ``on_step_end``, leaving out the first step of
   the run and of each epoch (loader start-up), exactly the window of
   ``GPUUtilizationMonitor``: data-wait share = wait / step time.

A high share with 0 workers that falls as workers are added is the
bottleneck and its fix; on a machine with few cores the workers compete with
the training process for them, which this table also shows.

Run::

    python -m benchmarks dataloader                      # 512 images, workers 0,1,2,4: about a minute or two
    python -m benchmarks dataloader --images 2048 --workers 0,2,4,8
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import List

from benchmarks import common

MEAN = [123.675, 116.28, 103.53]
STD = [58.395, 57.12, 57.375]


def generate_jpegs(root: str, count: int, classes: int = 4, seed: int = 0) -> List[str]:
    """``count`` JPEGs under ``root/class_<k>/``; returns their paths."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(seed)
    noise = rng.normal(0, 12, size=(600, 800, 3)).astype("float32")  # cropped at random offsets per image
    paths = []
    for k in range(classes):
        os.makedirs(os.path.join(root, f"class_{k}"), exist_ok=True)
    for i in range(count):
        h, w = int(rng.randint(300, 450)), int(rng.randint(400, 600))
        yy, xx = np.mgrid[0:h, 0:w].astype("float32")
        base = rng.uniform(0, 255, size=3)
        slope = rng.uniform(-0.4, 0.4, size=(3, 2))
        img = np.stack([base[c] + slope[c, 0] * yy + slope[c, 1] * xx for c in range(3)], axis=2)
        y0, x0 = int(rng.randint(0, 600 - h)), int(rng.randint(0, 800 - w))
        img += noise[y0:y0 + h, x0:x0 + w]
        path = os.path.join(root, f"class_{i % classes}", f"img_{i:05d}.jpg")
        Image.fromarray(np.clip(img, 0, 255).astype("uint8")).save(path, quality=90)
        paths.append(path)
    return paths


class JpegFolder:
    """Map-style dataset: ``(CHW float32 image, label)`` from ``root/<class>/*.jpg``."""

    def __init__(self, root: str):
        import paddle.vision.transforms as T

        classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        self.items = [(os.path.join(root, c, f), k) for k, c in enumerate(classes)
                      for f in sorted(os.listdir(os.path.join(root, c)))]
        self.transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.Transpose(),
                                    T.Normalize(mean=MEAN, std=STD, data_format="CHW")])

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        import numpy as np
        from PIL import Image

        path, label = self.items[i]
        with Image.open(path) as im:
            image = im.convert("RGB")
        return self.transform(image), np.int64(label)


def _tiny_convnet(classes: int):
    import paddle.nn as nn

    # cheap on purpose: an accelerator's step is short, so the input pipeline is what limits it
    return nn.Sequential(nn.AvgPool2D(4), nn.Conv2D(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(8, classes))


def child(root: str, workers: int, batch: int, epochs: int, seed: int) -> dict:
    common.quiet_paddle_warnings()
    import paddle

    from callbacks import Callback
    from trainer import Trainer, TrainingArguments

    paddle.set_device("cpu")
    dataset = JpegFolder(root)
    # 1. the pipeline alone
    loader = paddle.io.DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers)
    it = iter(loader)
    next(it)  # worker start-up
    start, n = time.perf_counter(), 0
    for images, _ in it:
        n += images.shape[0]
    pipeline_s = time.perf_counter() - start
    del it, loader

    # 2. training through the Trainer, data wait recorded like GPUUtilizationMonitor
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

    rec = RecordWait()
    out_dir = tempfile.mkdtemp(prefix="bench-dataloader-")
    try:
        paddle.seed(seed)
        model = _tiny_convnet(len({label for _, label in dataset.items}))
        args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch, num_train_epochs=epochs,
                                 dataloader_num_workers=workers, dataloader_drop_last=True, report_to=[],
                                 save_strategy="no", evaluation_strategy="no", learning_rate=1e-3, seed=seed)
        Trainer(model, args, train_dataset=dataset, loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[rec]).fit()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    step_s = rec.time / max(1, rec.steps)
    return {"workers": workers, "pipeline_images_per_s": n / pipeline_s, "pipeline_images": n,
            "train_steps": rec.steps, "step_ms": 1e3 * step_s, "wait_ms": 1e3 * rec.wait / max(1, rec.steps),
            "data_wait_share": rec.wait / rec.time if rec.time else float("nan"),
            "train_images_per_s": batch / step_s if step_s else float("nan"), "peak_rss_mb": common.peak_rss_mb()}


def report(rows: List[dict], images: int, batch: int, epochs: int, info: dict) -> str:
    table = [[r["workers"], common.fmt(r["pipeline_images_per_s"], 1), common.fmt(r["step_ms"], 1),
              common.fmt(r["wait_ms"], 1), f"{100 * r['data_wait_share']:.1f}%", common.fmt(r["train_images_per_s"], 1)]
             for r in rows]
    return "\n".join([
        f"Machine: {common.machine_line(info)}; {common.load_line()} at the end of the run.",
        f"{images} generated JPEGs (~500x375), batch {batch}; training: {epochs} epochs of a tiny conv net through "
        "trainer.Trainer, the first step of the run and of each epoch left out (as GPUUtilizationMonitor does).", "",
        common.markdown_table(["dataloader_num_workers", "pipeline images/s", "train step ms", "data wait ms/step",
                               "data-wait share", "train images/s"], table), ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks dataloader", description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=512, help="JPEGs to generate (default 512)")
    p.add_argument("--workers", default="0,1,2,4", help="dataloader_num_workers settings (default 0,1,2,4)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2, help="training epochs per setting (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--markdown", help="also write the report to this file")
    p.add_argument("--json", help="write the raw measurements to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)  # the image folder
    p.add_argument("--child-workers", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        common.emit(child(a.child, a.child_workers, a.batch, a.epochs, a.seed))
        return 0
    if a.images < 2 * a.batch:
        p.error(f"--images must be at least 2 batches ({2 * a.batch})")
    workers = [int(w) for w in common.split_list(a.workers)]
    info = common.machine_info()
    print(f"# dataloader: workers {workers}; {common.machine_line(info)}", flush=True)
    root = tempfile.mkdtemp(prefix="bench-jpegs-")
    try:
        start = time.perf_counter()
        generate_jpegs(root, a.images, seed=a.seed)
        print(f"  generated {a.images} JPEGs in {time.perf_counter() - start:.1f} s", flush=True)
        rows = []
        for w in workers:
            cmd = [sys.executable, "-m", "benchmarks.dataloader", "--child", root, "--child-workers", str(w),
                   "--batch", str(a.batch), "--epochs", str(a.epochs), "--seed", str(a.seed)]
            res = common.run_child(cmd, timeout=a.timeout)
            rows.append(res)
            print(f"  workers {w}: pipeline {res['pipeline_images_per_s']:.1f} images/s, "
                  f"data-wait share {100 * res['data_wait_share']:.1f}%", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = report(rows, a.images, a.batch, a.epochs, info)
    print()
    print(text)
    common.write_outputs(text, {"machine": info, "rows": rows}, a.markdown, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
