"""The default ImageFolder pipeline (``--data_backend turbo``) on real files made here:
libjpeg-turbo at the DCT scale each crop box allows, Pillow for the rest, the same boxes
as paddle.vision's transforms, the evaluation path within 8/255 of Pillow's."""

import os
import random
from types import SimpleNamespace

import numpy as np
import paddle
import paddle.vision.transforms as T
import pytest
from patience import patience
from PIL import Image

from models.resnet import crops
from models.resnet.data import imagefolder_data
from models.resnet.imagefolder import BadImageError, ImageFolderDataset, read_rgb
from models.resnet.task_callbacks import BadImages
from models.resnet.transforms import eval_transform, imagefolder_train
from models.resnet.turbo import TurboTransform, dct_scale, resize_antialiased


def photo(h, w, seed=0):
    """A smooth colour field with mild noise: compresses and resizes like a photograph."""
    rng = np.random.RandomState(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype("float32")
    base, slope = rng.uniform(30, 220, 3), rng.uniform(-0.3, 0.3, (3, 2))
    img = np.stack([base[c] + slope[c, 0] * yy * 300 / h + slope[c, 1] * xx * 300 / w
                    + 25 * np.sin(xx / (7 + 3 * c)) * np.cos(yy / 11) for c in range(3)], axis=2)
    return np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype("uint8")


def save(path, array, mode="RGB", **kw):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(array).convert(mode).save(path, **kw)
    return str(path)


def mad(a, b):
    return float(np.abs(np.asarray(a, dtype="int16") - np.asarray(b, dtype="int16")).mean())


# ---- the boxes -------------------------------------------------------------------------
@pytest.mark.parametrize("size", [(375, 500), (500, 333), (64, 900), (900, 64), (30, 30)])
def test_random_boxes_are_paddle_visions_own_for_the_same_seed(size):
    height, width = size
    image = Image.new("RGB", (width, height))
    reference = T.RandomResizedCrop(224)
    for seed in range(40):
        random.seed(seed)
        np.random.seed(seed)
        expected = reference._dynamic_get_param(image)
        random.seed(seed)
        np.random.seed(seed)
        assert crops.random_resized_crop_box(height, width) == expected


def test_dct_scale_is_the_smallest_that_leaves_the_box_its_output_size():
    rng = np.random.RandomState(0)
    for _ in range(500):
        h, w = rng.randint(50, 4000, size=2)
        k = dct_scale(h, w, 224)
        assert k in (1, 2, 4, 8)
        assert k == 1 or (h / k >= 224 and w / k >= 224)       # still covers the output
        assert k == 8 or h / (2 * k) < 224 or w / (2 * k) < 224  # the next scale would not


def test_a_small_crop_of_a_large_jpeg_decodes_at_a_quarter_of_its_size(tmp_path):
    path = save(tmp_path / "big.jpg", photo(1200, 1600), quality=90)
    data = open(path, "rb").read()
    t = TurboTransform.for_evaluation(224, 256)
    image, box = t.decode_scaled(data, 1200, 1600, (0, 0, 1000, 1000))  # a 1000-px box: 1/4 leaves 250 >= 224
    assert image.shape == (300, 400, 3)
    assert box == (0.0, 0.0, 250.0, 250.0)
    image, _ = t.decode_scaled(data, 1200, 1600, (0, 0, 400, 400))      # 1/2 would leave 200 < 224: full size
    assert image.shape == (1200, 1600, 3)


def test_the_resize_is_antialiased():
    for h, w in ((300, 300), (403, 403), (447, 447), (448, 597), (520, 660), (400, 600)):
        # 1-pixel checkerboards shrunk by 1.3-2.9x (3- and 5-tap prefilters): flat grey, not a pattern
        checker = np.repeat((np.indices((h, w)).sum(0) % 2 * 255).astype("uint8")[..., None], 3, axis=2)
        out = resize_antialiased(checker, 224)
        assert out.shape == (224, 224, 3) and out.std() < 2.0 and abs(out.mean() - 127.5) < 2, (h, w)
    big = resize_antialiased(np.zeros((1000, 700, 3), dtype="uint8"), 224)  # >= 3x: INTER_AREA
    assert big.shape == (224, 224, 3)


def test_the_resize_stays_near_pillows_antialiased_bilinear_at_every_factor():
    """A textured crop shrunk by 1.1-2.9x per axis (every prefilter) is within 3/255 of Pillow's resize."""
    rng = np.random.RandomState(0)
    for h, w in ((250, 260), (300, 420), (470, 500), (460, 620), (600, 650)):
        image = photo(h, w, seed=h)
        image = np.clip(image.astype("int16") + rng.normal(0, 12, image.shape), 0, 255).astype("uint8")
        expected = np.asarray(Image.fromarray(image).resize((224, 224), Image.BILINEAR))
        assert mad(resize_antialiased(image, 224), expected) < 3, (h, w)


# ---- against Pillow + paddle.vision ------------------------------------------------------
def test_evaluation_path_is_within_8_of_255_of_pillows_and_training_cuts_the_same_crops(tmp_path):
    paths = [save(tmp_path / f"{i}.jpg", photo(300 + 37 * i, 420 + 23 * i, seed=i), quality=90) for i in range(8)]
    paths.append(save(tmp_path / "big.jpg", photo(1100, 1500, seed=9), quality=90))  # decoded at 1/4
    pillow_eval, ours_eval = eval_transform(224, 256), TurboTransform.for_evaluation(224, 256)
    diffs = [mad(pillow_eval(read_rgb(p)), ours_eval.from_file(p)) for p in paths]
    assert max(diffs) <= 8 and np.mean(diffs) <= 3, diffs
    pillow_train, ours_train = imagefolder_train(224), TurboTransform.for_training(224)
    for seed, p in enumerate(paths):
        random.seed(seed)
        np.random.seed(seed)
        expected = pillow_train(read_rgb(p))
        random.seed(seed)
        np.random.seed(seed)
        got = ours_train.from_file(p)
        assert got.shape == (3, 224, 224) and got.dtype == np.uint8
        assert mad(expected, got) <= 8, (p, mad(expected, got))  # same box, same flip


@pytest.mark.parametrize("name, mode, kw", [("gray.jpg", "L", {}), ("cmyk.jpg", "CMYK", {}), ("rgba.png", "RGBA", {}),
                                            ("p.png", "P", {}), ("a.bmp", "RGB", {})])
def test_other_modes_and_formats_come_out_as_rgb_like_pillows(tmp_path, name, mode, kw):
    path = save(tmp_path / name, photo(260, 300), mode, **kw)
    out = TurboTransform.for_evaluation(224, 256).from_file(path)
    assert out.shape == (3, 224, 224) and out.dtype == np.uint8
    assert mad(out, eval_transform(224, 256)(read_rgb(path))) <= 8


def test_truncated_missing_and_junk_files_raise_bad_image_error_naming_them(tmp_path):
    good = save(tmp_path / "good.jpg", photo(300, 400), quality=90)
    data = open(good, "rb").read()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    t = TurboTransform.for_training(224)
    for name in ("cut.jpg", "junk.jpg", "missing.jpg"):
        with pytest.raises(BadImageError) as info:
            t.from_file(str(tmp_path / name))
        assert str(tmp_path / name) in str(info.value) and "\n" not in str(info.value)


# ---- through the dataset and the task's bundle ------------------------------------------------
def _tree(root, corrupt=True):
    for split in ("train", "val"):
        for k, c in enumerate(("cat", "dog")):
            for i in range(5):
                save(os.path.join(root, split, c, f"{i}.jpg"), photo(120 + 9 * i, 150, seed=10 * k + i), quality=85)
            save(os.path.join(root, split, c, "gray.jpg"), photo(90, 100), "L")
            save(os.path.join(root, split, c, "cmyk.jpg"), photo(90, 100), "CMYK")
            save(os.path.join(root, split, c, "x.png"), photo(80, 70))
    if corrupt:
        path = os.path.join(root, "train", "dog", "2.jpg")
        data = open(path, "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_jpegs_are_skipped_and_counted_through_dataloader_workers(tmp_path, workers):
    root = _tree(str(tmp_path / "data"))
    ds = ImageFolderDataset(os.path.join(root, "train"), TurboTransform.for_training(32), bad_images="skip")
    loader = paddle.io.DataLoader(ds, batch_size=4, shuffle=False, num_workers=workers)
    shapes = [tuple(x.shape) for x, _ in loader]
    assert shapes == [(4, 3, 32, 32)] * 4  # 16 files, the bad one replaced by the next
    assert ds.bad_paths() == [os.path.join(root, "train", "dog", "2.jpg")]
    BadImages([ds], "skip", info={})._check()
    with pytest.raises(BadImageError, match="2.jpg"):
        BadImages([ds], "fail", info={})._check()


@pytest.mark.parametrize("backend", ["turbo", "pillow"])
def test_imagefolder_data_returns_uint8_chw_samples_with_labels(tmp_path, backend):
    root = _tree(str(tmp_path / "data"), corrupt=False)
    options = SimpleNamespace(data_dir=root, image_size=48, resize_size=56, augment=True, bad_images="skip",
                              data_backend=backend)
    bundle = imagefolder_data(options)
    assert bundle.class_names == ["cat", "dog"] and len(bundle.train) == 16 and bundle.test is bundle.val
    for ds in (bundle.train, bundle.val):
        x, y = ds[9]
        assert x.shape == (3, 48, 48) and x.dtype == np.uint8 and int(y) == 1
    if backend == "turbo":
        assert isinstance(bundle.train.transform, TurboTransform) and bundle.train.transform.train
        assert not bundle.val.transform.train


# ---- batches assembled in place, crop boxes decoded as regions ------------------------------------
def _batch_tree(root):
    """JPEGs of several sizes (one large enough for a reduced DCT scale), gray, CMYK, PNG, a truncated JPEG."""
    _tree(root, corrupt=True)
    save(os.path.join(root, "train", "cat", "big.jpg"), photo(700, 900, seed=3), quality=90)
    return root


@pytest.mark.parametrize("regions", [True, False], ids=["region-decode", "without-nvimgcodec"])
@pytest.mark.parametrize("train", [True, False], ids=["training", "evaluation"])
def test_a_batch_is_the_one_by_one_samples_written_in_place(tmp_path, monkeypatch, regions, train):
    """__getitems__ (region decode of each box, or the whole-image path without nvImageCodec) gives exactly
    the samples of one-by-one __getitem__ calls from the same RNG state, as default_collate_fn would stack them."""
    from paddle.io.dataloader.collate import default_collate_fn

    from models.resnet import jpeg_regions
    from models.resnet.turbo import TurboImageFolder
    from trainer.data.batch import AssembledBatch, default_collate

    if not regions:
        monkeypatch.setattr(jpeg_regions, "_missing", "switched off by the test")
    assert jpeg_regions.available() == regions
    root = _batch_tree(str(tmp_path / "data"))
    transform = TurboTransform.for_training(96) if train else TurboTransform.for_evaluation(96, 108)
    one_by_one = TurboImageFolder(os.path.join(root, "train"), transform, bad_images="skip")
    batched = TurboImageFolder(os.path.join(root, "train"), transform, bad_images="skip")
    indices = list(range(len(one_by_one)))[::-1]  # the truncated file and the big one included
    for seed in (0, 1):
        random.seed(seed)
        np.random.seed(seed)
        expected = default_collate_fn([one_by_one[i] for i in indices])
        random.seed(seed)
        np.random.seed(seed)
        got = batched.__getitems__(indices)
        assert isinstance(got, AssembledBatch) and len(got) == len(indices)
        images, labels = default_collate(got)
        assert images.dtype == np.uint8 and images.shape == (len(indices), 3, 96, 96)
        assert np.array_equal(images, expected[0]) and np.array_equal(labels, expected[1])
        assert all(np.shares_memory(x, images) for x, _ in got)  # the samples are the batch's rows
    assert batched.bad_paths() == one_by_one.bad_paths() == [os.path.join(root, "train", "dog", "2.jpg")]
    # the 9 whole small JPEGs and 2 gray ones take the region decode (the big one a reduced DCT scale, mostly)
    assert (batched.region_decoded >= 2 * 9) if regions else batched.region_decoded == 0


def test_the_region_decode_cuts_the_box_of_the_whole_image_decode(tmp_path):
    """nvImageCodec's region of a JPEG is the same pixels as libjpeg-turbo's whole image cut to that box."""
    import simplejpeg

    from models.resnet import jpeg_regions

    data = open(save(str(tmp_path / "a.jpg"), photo(375, 500, seed=4), quality=90), "rb").read()
    gray = open(save(str(tmp_path / "g.jpg"), photo(200, 240, seed=5), "L", quality=90), "rb").read()
    regions = [(17, 33, 301, 420), (0, 0, 375, 500), (100, 7, 101, 8)]
    for fast in (True, False):
        full = simplejpeg.decode_jpeg(data, fastdct=fast, fastupsample=fast)
        got = jpeg_regions.decode_regions([data] * 3, regions, fast=fast)
        for (y0, x0, y1, x1), crop in zip(regions, got):
            assert np.array_equal(crop, full[y0:y1, x0:x1])
        gray_crop, = jpeg_regions.decode_regions([gray], [(10, 20, 110, 220)], fast=fast)
        assert gray_crop is None or mad(gray_crop, read_rgb(str(tmp_path / "g.jpg")).crop((20, 10, 220, 110))) < 1
    assert not jpeg_regions.complete(data[: len(data) // 2]) and jpeg_regions.complete(data)


@pytest.mark.parametrize("train", [True, False], ids=["training", "evaluation"])
def test_one_by_one_samples_decode_only_the_box_and_match_the_whole_image_path(tmp_path, monkeypatch, train):
    """from_file (``dataset[i]``, the per-sample path) decodes a full-scale box alone, as batches do: the same
    pixels and draws as decoding the whole image and cutting the box (nvImageCodec switched off); a box small
    enough for a reduced DCT scale, a truncated file and a PNG never reach the region decode."""
    from models.resnet import jpeg_regions

    paths = [save(tmp_path / f"{i}.jpg", photo(300 + 41 * i, 380 + 29 * i, seed=i), quality=90) for i in range(6)]
    paths.append(save(tmp_path / "big.jpg", photo(1300, 1700, seed=7), quality=90))
    data = open(paths[0], "rb").read()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    paths += [str(tmp_path / "cut.jpg"), save(tmp_path / "x.png", photo(260, 300))]
    transform = TurboTransform.for_training(224) if train else TurboTransform.for_evaluation(224, 256)
    calls = []
    real = jpeg_regions.decode_regions

    def counted(datas, regions, fast):  # the real decode, counted
        calls.append((len(datas), fast))
        return real(datas, regions, fast)

    def run():
        out = []
        for seed, p in enumerate(paths):
            random.seed(seed)
            np.random.seed(seed)
            try:
                out.append(transform.from_file(p))
            except BadImageError:
                out.append(None)
            out.append((random.random(), np.random.rand()))  # what the sample drew
        return out

    monkeypatch.setattr(jpeg_regions, "decode_regions", counted)
    assert jpeg_regions.available()
    boxes_only = run()
    assert calls == [(1, train)] * 6  # the 500-px-class JPEGs; not the big one (1/2 or 1/4), the cut file, the PNG
    monkeypatch.setattr(jpeg_regions, "_missing", "switched off by the test")
    whole = run()
    assert len(calls) == 6
    for a, b in zip(boxes_only, whole):
        assert (a is None and b is None) or (isinstance(a, tuple) and a == b) or np.array_equal(a, b)


def test_a_run_with_two_loader_workers_resumed_at_a_step_boundary_ends_bitwise_equal(tmp_path):
    """Workers build whole batches (region decode), each seeded from (seed, epoch, its first index): a run
    resumed from step 3 cuts the same boxes and flips as the uninterrupted one, whichever worker builds them."""
    import subprocess
    import sys

    from helpers import REPO
    from safetensors.numpy import load_file

    _tree(str(tmp_path / "data"), corrupt=False)
    common = ["run", "resnet", "--data_dir", "data", "--depth", "18", "--image_size", "64", "--resize_size", "72",
              "--per_device_train_batch_size", "4", "--dataloader_num_workers", "2", "--max_steps", "6",
              "--save_strategy", "steps", "--save_steps", "3", "--save_total_limit", "5", "--evaluation_strategy", "no",
              "--disable_tqdm", "true", "--logging_steps", "1"]

    def ptrain(*args):
        out = subprocess.run([sys.executable, "-m", "trainer.cli", *common, *args], capture_output=True, text=True,
                             cwd=tmp_path, timeout=patience(300), env=dict(os.environ, PYTHONPATH=REPO))
        assert out.returncode == 0, out.stderr[-3000:]

    ptrain("--output_dir", "full")
    ptrain("--output_dir", "resumed", "--resume_from_checkpoint", os.path.join("full", "checkpoints", "step-3"))
    a = load_file(str(tmp_path / "full" / "checkpoints" / "step-6" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "checkpoints" / "step-6" / "model.safetensors"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("workers", [0, 2])
def test_assembled_batches_skip_and_count_a_corrupt_jpeg_through_the_trainers_loader(tmp_path, workers):
    """The Trainer's loader (whole batches per worker fetch): batches keep their size, the truncated file
    is marked in the shared flags whichever process met it, and fail mode names it."""
    from models.resnet.turbo import TurboImageFolder
    from trainer.data import ResumableDistributedBatchSampler, SeededDataset, close_iterator, make_loader

    root = _tree(str(tmp_path / "data"))
    ds = TurboImageFolder(os.path.join(root, "train"), TurboTransform.for_training(32), bad_images="skip")
    sampler = ResumableDistributedBatchSampler(len(ds), 4, shuffle=True, seed=0, drop_last=True)
    assert len(ds.__getitems__([0, 1])) == 2  # this process's region decoder exists before the workers fork
    it = iter(make_loader(SeededDataset(ds, 0) if workers else ds, sampler, None, workers))
    try:
        shapes = [(tuple(x.shape), str(x.dtype)) for x, _ in it]
    finally:
        close_iterator(it)
    assert shapes == [((4, 3, 32, 32), "paddle.uint8")] * 4
    assert ds.bad_paths() == [os.path.join(root, "train", "dog", "2.jpg")]
    with pytest.raises(BadImageError, match="2.jpg"):
        BadImages([ds], "fail", info={})._check()
