"""Exact resume past a skipped image (issue 32, item 3): with one truncated JPEG in train/ and
``--bad_images skip``, a run resumed from its step-4 checkpoint ends bitwise equal to the uninterrupted one,
for the turbo, Pillow and DALI backends. The skip is a function of the file: a batch draws the same crops
whether this process meets the bad file for the first time or marked it long ago."""

import os
import random
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import REPO
from PIL import Image

from models.resnet.dali import dali_missing
from models.resnet.data import imagefolder_data

BACKENDS = ["turbo", "pillow", pytest.param("dali", marks=pytest.mark.skipif(
    dali_missing() is not None, reason="NVIDIA DALI not installed: pip install '.[dali]'"))]


def photo(h, w, seed):
    rng = np.random.RandomState(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype("float32")
    base = rng.uniform(30, 220, 3)
    img = np.stack([base[c] + 40 * np.sin(xx / (9 + 4 * c) + seed) * np.cos(yy / 13) for c in range(3)], axis=2)
    return np.clip(img + rng.normal(0, 5, img.shape), 0, 255).astype("uint8")


def tree(root):
    """16 training images per split (JPEGs of several sizes, a grey and a CMYK JPEG, a PNG per class);
    train/dog/2.jpg cut in half."""
    for split in ("train", "val"):
        for k, c in enumerate(("cat", "dog")):
            folder = os.path.join(root, split, c)
            os.makedirs(folder)
            for i in range(5):
                Image.fromarray(photo(120 + 9 * i, 150, 10 * k + i)).save(os.path.join(folder, f"{i}.jpg"), quality=85)
            Image.fromarray(photo(90, 100, 7)).convert("L").save(os.path.join(folder, "gray.jpg"))
            Image.fromarray(photo(90, 100, 8)).convert("CMYK").save(os.path.join(folder, "cmyk.jpg"))
            Image.fromarray(photo(80, 70, 9)).save(os.path.join(folder, "x.png"))
    path = os.path.join(root, "train", "dog", "2.jpg")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    return root


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_draws_the_same_whether_the_bad_file_is_met_first_or_known(tmp_path, backend):
    root = tree(str(tmp_path / "data"))
    options = SimpleNamespace(data_dir=root, image_size=32, resize_size=36, augment=True, bad_images="skip",
                              data_backend=backend)
    bad = os.path.join(root, "train", "dog", "2.jpg")

    def batch(ds, known_bad):
        if known_bad:
            ds[int(np.flatnonzero([ds.path(i) == bad for i in range(len(ds))])[0])]  # met, marked
            assert ds.bad_paths() == [bad]
        random.seed(3)
        np.random.seed(3)
        fetch = getattr(ds, "__getitems__", None)
        got = fetch(list(range(len(ds)))) if fetch else [ds[i] for i in range(len(ds))]
        return [np.asarray(image) for image, _ in got], (random.random(), np.random.uniform())

    first, after_first = batch(imagefolder_data(options).train, known_bad=False)
    known, after_known = batch(imagefolder_data(options).train, known_bad=True)
    assert all(np.array_equal(a, b) for a, b in zip(first, known)) and after_first == after_known


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_resumed_past_a_skipped_image_ends_bitwise_equal(tmp_path, backend):
    from safetensors.numpy import load_file

    tree(str(tmp_path / "data"))
    common = ["run", "resnet", "--data_dir", "data", "--depth", "18", "--image_size", "32", "--resize_size", "36",
              "--per_device_train_batch_size", "4", "--max_steps", "8", "--save_steps", "4", "--save_total_limit", "5",
              "--evaluation_strategy", "no", "--disable_tqdm", "true", "--data_backend", backend]

    def ptrain(*args):
        out = subprocess.run([sys.executable, "-m", "trainer.cli", *common, *args], capture_output=True, text=True,
                             cwd=tmp_path, timeout=900, env=dict(os.environ, PYTHONPATH=REPO))
        assert out.returncode == 0, out.stderr[-3000:]
        return out

    full = ptrain("--output_dir", "full")
    assert "unreadable image" in full.stderr and "2.jpg" in full.stderr
    # 16 images, 4 per step: the resumed run's epoch 2 meets dog/2.jpg first, the full run has marked it in epoch 1
    ptrain("--output_dir", "resumed", "--resume_from_checkpoint", os.path.join("full", "checkpoints", "step-4"))
    a = load_file(str(tmp_path / "full" / "checkpoints" / "step-8" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "checkpoints" / "step-8" / "model.safetensors"))
    assert a.keys() == b.keys() and [k for k in a if not np.array_equal(a[k], b[k])] == []
