"""``--data_backend dali`` on DALI's real CPU pipeline (CI installs the ``dali`` extra):
batches decoded by DALI, the files it does not get decoded per sample, the same Trainer
fed through the sampler's batches, exact resume at a step boundary, two ranks."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import REPO
from PIL import Image

from models.resnet.dali import dali_missing



@pytest.fixture(autouse=True, scope="module")
def dali_installed():
    """Skips the file without DALI. Checked here, not at collection: importing DALI takes ~0.8 s, which every
    worker of the suite would pay to collect a file only one of them runs."""
    missing = dali_missing()
    if missing is not None:
        pytest.skip(f"NVIDIA DALI not installed ({missing}): pip install '.[dali]'")


def photo(h, w, seed=0):
    rng = np.random.RandomState(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype("float32")
    base = rng.uniform(30, 220, 3)
    img = np.stack([base[c] + 40 * np.sin(xx / (9 + 4 * c) + seed) * np.cos(yy / 13) for c in range(3)], axis=2)
    return np.clip(img + rng.normal(0, 5, img.shape), 0, 255).astype("uint8")


def tree(root, per_class=6, extras=True, corrupt=True):
    for split in ("train", "val"):
        for k, c in enumerate(("cat", "dog")):
            os.makedirs(os.path.join(root, split, c))
            for i in range(per_class):
                Image.fromarray(photo(90 + 7 * i, 120, seed=10 * k + i)).save(os.path.join(root, split, c, f"{i}.jpg"),
                                                                           quality=90)
            if extras:
                Image.fromarray(photo(80, 90)).convert("CMYK").save(os.path.join(root, split, c, "cmyk.jpg"))
                Image.fromarray(photo(80, 90)).convert("L").save(os.path.join(root, split, c, "gray.jpg"))
                Image.fromarray(photo(70, 60)).save(os.path.join(root, split, c, "x.png"))
    if corrupt:
        path = os.path.join(root, "train", "dog", "1.jpg")
        data = open(path, "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
    return root


def options(root, size=48, resize=56):
    return SimpleNamespace(data_dir=root, image_size=size, resize_size=resize, augment=True, bad_images="skip",
                           data_backend="dali")


def test_dali_decodes_the_batch_and_leaves_cmyk_png_and_truncated_files_to_the_per_sample_path(tmp_path):
    from models.resnet.data import imagefolder_data
    from models.resnet.dali import DaliImageFolder

    bundle = imagefolder_data(options(tree(str(tmp_path / "d"))))
    train = bundle.train
    assert isinstance(train, DaliImageFolder) and train.device is None  # chosen when the pipeline is built
    samples = train.__getitems__(list(range(len(train))))
    assert len(samples) == len(train) == 18
    assert all(x.shape == (3, 48, 48) and x.dtype == np.uint8 for x, _ in samples)
    assert [int(y) for _, y in samples] == [int(y) for y in train.labels[:9]] + [1] + [int(y) for y in train.labels[10:]]
    assert train.device == "cpu" and train.dali_batches == 1
    assert train.fallback_samples == 5  # 2 CMYK + 2 PNG + the truncated file (its neighbour stands in)
    assert train.bad_paths() == [os.path.join(str(tmp_path / "d"), "train", "dog", "1.jpg")]
    x, y = train[3]  # one sample alone: the turbo path
    assert x.shape == (3, 48, 48) and int(y) == 0


def test_dali_evaluation_crops_are_within_8_of_255_of_pillows(tmp_path):
    from models.resnet.data import imagefolder_data

    root = tree(str(tmp_path / "d"), extras=False, corrupt=False)
    dali_val = imagefolder_data(options(root, 64, 73)).val
    pillow_val = imagefolder_data(SimpleNamespace(**{**vars(options(root, 64, 73)), "data_backend": "pillow"})).val
    got = dali_val.__getitems__(list(range(len(dali_val))))
    assert dali_val.dali_batches == 1 and dali_val.fallback_samples == 0
    diffs = [np.abs(x.astype("int16") - pillow_val[i][0].astype("int16")).mean() for i, (x, _) in enumerate(got)]
    assert max(diffs) <= 8 and np.mean(diffs) <= 3, diffs
    again = dali_val.__getitems__(list(range(len(dali_val))))
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(got, again))  # deterministic


FAST = ["--depth", "18", "--image_size", "32", "--resize_size", "36", "--disable_tqdm", "true",
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "8", "--data_backend", "dali",
        "--evaluation_strategy", "no", "--logging_steps", "1"]


def ptrain(*args, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "trainer.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=dict(os.environ, PYTHONPATH=REPO))


def test_a_run_resumed_at_a_step_boundary_ends_bitwise_equal_to_the_uninterrupted_one(tmp_path):
    """Crop boxes and flips come from the host RNGs the checkpoint restores; the sampler computes its position."""
    from safetensors.numpy import load_file

    tree(str(tmp_path / "data"), per_class=8, extras=False, corrupt=False)
    common = ["--data_dir", "data", "--max_steps", "6", "--save_strategy", "steps", "--save_steps", "3",
              "--save_total_limit", "5", *FAST]
    full = ptrain("run", "resnet", "--output_dir", "full", *common, cwd=tmp_path)
    assert full.returncode == 0, full.stderr[-3000:]
    resumed = ptrain("run", "resnet", "--output_dir", "resumed", "--resume_from_checkpoint",
                     os.path.join("full", "checkpoints", "step-3"), *common, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = load_file(str(tmp_path / "full" / "checkpoints" / "step-6" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "checkpoints" / "step-6" / "model.safetensors"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    results = json.loads((tmp_path / "full" / "results.json").read_text())
    assert results["status"] == "completed" and results["dataset"] == "imagefolder"


def test_two_processes_train_and_evaluate_through_dali_and_loader_workers_are_refused(tmp_path):
    """Each rank's DALI pipeline gets that rank's batches from the Trainer's sampler (sharded as for any dataset)."""
    tree(str(tmp_path / "data"), per_class=8, extras=False, corrupt=False)
    out = ptrain("run", "resnet", "--nproc", "2", "--data_dir", "data", "--max_steps", "2", "--output_dir", "dp",
                 *FAST, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "dp" / "results.json").read_text())
    assert results["status"] == "completed" and results["test_samples"] == 16
    bad = ptrain("run", "resnet", "--data_dir", "data", "--max_steps", "1", "--output_dir", "w",
                 "--dataloader_num_workers", "2", *FAST, cwd=tmp_path)
    assert bad.returncode == 2 and "--dataloader_num_workers 0" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
