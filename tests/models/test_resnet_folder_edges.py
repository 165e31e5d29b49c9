"""ImageFolder's edge cases (issue 32, item 5) on real files made here: symlinks followed once per real
folder and file (loops named and skipped), 16-bit images scaled to 8 bits and 32-bit ones refused naming the
file, and a pixel limit read from the header (a JPEG claiming 12000x12000 over a 40x48 scan is never decoded)."""

import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import REPO
from PIL import Image

from models.resnet.dali import dali_missing
from models.resnet.data import imagefolder_data
from models.resnet.imagefolder import BadImageError, ImageFolderDataset, read_rgb
from models.resnet.task_callbacks import BadImages
from models.resnet.turbo import TurboTransform

BACKENDS = ["turbo", "pillow", pytest.param("dali", marks=pytest.mark.skipif(
    dali_missing() is not None, reason="NVIDIA DALI not installed: pip install '.[dali]'"))]


def picture(seed, h=40, w=48):
    return (np.random.RandomState(seed).rand(h, w, 3) * 255).astype("uint8")


def images(folder, names, seed=0):
    os.makedirs(folder, exist_ok=True)
    for k, name in enumerate(names):
        Image.fromarray(picture(seed + k)).save(os.path.join(folder, name))


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# ---- symlinks ------------------------------------------------------------------------------------------------
def test_symlink_loops_are_named_once_and_skipped_and_every_real_image_counts_once(tmp_path, caplog):
    root = tmp_path / "train"
    images(root / "a", ["0.jpg", "1.jpg"])
    images(root / "a" / "sub", ["2.jpg"], seed=5)
    images(root / "b", ["0.jpg", "1.jpg", "2.jpg"], seed=10)
    images(tmp_path / "outside" / "deep", ["o.jpg"], seed=20)
    os.symlink(".", root / "a" / "loop")                  # the issue's: every image ~20 times
    os.symlink("..", root / "b" / "up")                   # the issue's: an endless dataset
    os.symlink("../b", root / "a" / "zb")                 # b's images would get label a
    os.symlink("0.jpg", root / "a" / "copy.jpg")          # a second path to one file
    os.symlink("sub", root / "a" / "again")               # a second path to one folder
    os.symlink(tmp_path / "outside", root / "b" / "ext")  # outside the tree: followed
    os.symlink(root / "b", tmp_path / "outside" / "deep" / "back")  # a cycle through two links
    with caplog.at_level(logging.WARNING, logger="models.resnet"):
        ds = ImageFolderDataset(str(root), TurboTransform.for_evaluation(32, 36))
    paths = [p.decode() for p in ds.paths]
    assert paths == ["a/0.jpg", "a/1.jpg", "a/sub/2.jpg", "b/0.jpg", "b/1.jpg", "b/2.jpg", "b/ext/deep/o.jpg"]
    assert ds.labels.tolist() == [0, 0, 0, 1, 1, 1, 1]
    said = warnings_of(caplog)
    assert "symlink a/loop -> . is a loop (it leads back to a folder it is in): skipped" in said
    assert "symlink b/up -> .. is a loop (it leads back to a folder it is in): skipped" in said
    assert any(m.startswith("symlink a/zb -> ../b leads into class folder b") for m in said), said
    assert any(m.startswith("symlink b/ext/deep/back -> ") and "is a loop" in m for m in said), said
    assert any(m.startswith("2 image file(s) are reached twice") for m in said), said
    assert len(said) == 5 and all("\n" not in m for m in said)


# ---- pixel modes ---------------------------------------------------------------------------------------------
def test_a_16_bit_png_is_scaled_to_8_bits_by_every_path(tmp_path):
    ramp = (np.arange(48 * 64).reshape(48, 64) * 21).astype(np.uint16)  # 0 .. 64491
    Image.fromarray(ramp).save(tmp_path / "g16.png")
    assert Image.open(tmp_path / "g16.png").mode == "I;16"
    rgb = np.asarray(read_rgb(str(tmp_path / "g16.png")))
    expected = np.round(ramp / 257.0).astype(np.uint8)
    assert rgb.shape == (48, 64, 3) and np.array_equal(rgb[..., 0], expected) and np.array_equal(rgb[..., 2], expected)
    out = TurboTransform.for_evaluation(48, 48).from_file(str(tmp_path / "g16.png"))
    assert 90 < out.mean() < 160  # a ramp, not all white (255) as Pillow's own convert makes it


@pytest.mark.parametrize("mode, dtype, what", [("I", np.int32, "32-bit integer"), ("F", np.float32, "floating-point")])
def test_32_bit_images_are_refused_naming_the_file(tmp_path, mode, dtype, what):
    path = str(tmp_path / f"x_{mode}.tif")
    Image.fromarray(np.arange(40 * 48).reshape(40, 48).astype(dtype), mode).save(path)
    with pytest.raises(BadImageError) as refused:
        read_rgb(path)
    line = str(refused.value)
    assert line.startswith(f"image {path} cannot be read (mode {mode}: {what} pixels have no fixed range") and \
        "\n" not in line and refused.value.path == path


# ---- the pixel limit -----------------------------------------------------------------------------------------
def claims(path, height, width):
    """Rewrite a baseline JPEG's frame header (SOF0) to claim ``height`` x ``width`` over its small scan."""
    data = bytearray(open(path, "rb").read())
    at = data.index(b"\xff\xc0")
    data[at + 5:at + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_jpeg_whose_header_claims_144_mpx_is_a_bad_image_named_in_one_line(tmp_path, backend, caplog):
    root = tmp_path / "data"
    for split in ("train", "val"):
        images(root / split / "a", ["0.jpg", "1.jpg", "2.jpg"])
        images(root / split / "b", ["0.jpg", "1.jpg", "2.jpg"], seed=3)
    huge = str(root / "train" / "a" / "1.jpg")
    claims(huge, 12000, 12000)
    options = SimpleNamespace(data_dir=str(root), image_size=32, resize_size=36, augment=True, bad_images="skip",
                              data_backend=backend)
    train = imagefolder_data(options).train
    with caplog.at_level(logging.WARNING, logger="models.resnet"):
        fetch = getattr(train, "__getitems__", None)
        got = fetch([0, 1, 2, 3]) if fetch else [train[i] for i in range(4)]
    assert [int(label) for _, label in got] == [0, 0, 0, 1]  # a/1.jpg replaced by a/2.jpg, the next readable
    assert train.bad_paths() == [huge]
    (line,) = [m for m in warnings_of(caplog) if huge in m]
    assert "12000x12000 = 144.0 Mpx, over max_image_pixels 89478485 (89.5 Mpx)" in line, line
    with pytest.raises(BadImageError, match="1.jpg"):
        BadImages([train], "fail", info={})._check()
    train = imagefolder_data(SimpleNamespace(**{**vars(options), "max_image_pixels": 0})).train
    assert train.max_pixels == 0  # 0: no limit of ours (the file's scan is 40x48: it is not readable either way)


def test_ptrain_fails_naming_the_oversized_image_and_refuses_a_negative_limit(tmp_path):
    root = tmp_path / "data"
    for split in ("train", "val"):
        images(root / split / "a", ["0.jpg", "1.jpg"])
        images(root / split / "b", ["0.jpg", "1.jpg"], seed=3)
    claims(str(root / "train" / "b" / "0.jpg"), 12000, 12000)
    common = ["run", "resnet", "--data_dir", "data", "--depth", "18", "--image_size", "32", "--resize_size", "36",
              "--per_device_train_batch_size", "4", "--max_steps", "2", "--evaluation_strategy", "no",
              "--save_strategy", "no", "--disable_tqdm", "true", "--output_dir", "out"]

    def ptrain(*args):
        return subprocess.run([sys.executable, "-m", "trainer.cli", *common, *args], capture_output=True, text=True,
                              cwd=tmp_path, timeout=600, env=dict(os.environ, PYTHONPATH=REPO))

    failed = ptrain("--bad_images", "fail")
    assert failed.returncode == BadImageError.exit_code, failed.stderr[-3000:]
    (line,) = [x for x in failed.stderr.splitlines() if x.startswith("ptrain: error:")]
    assert "b/0.jpg" in line and "replace or delete the file, or pass --bad_images skip" in line, line
    assert "12000x12000 = 144.0 Mpx" in failed.stderr
    refused = ptrain("--max_image_pixels", "-1")
    assert refused.returncode == 2 and "max_image_pixels=-1 is not allowed" in refused.stderr, refused.stderr[-2000:]
