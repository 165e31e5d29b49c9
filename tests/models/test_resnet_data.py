"""ResNet task data: the digits split, transforms on real image files, ImageFolder
with corrupt files (through real DataLoader workers), CIFAR-10 from a local archive."""

import io
import os
import pickle
import tarfile
import time
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from patience import patience
from PIL import Image

from models.resnet import data as rdata
from models.resnet.imagefolder import MAX_CONSECUTIVE_BAD, BadImageError, ImageFolderDataset
from models.resnet.task_callbacks import BadImages
from models.resnet.task import ResNetOptions
from models.resnet.transforms import (IMAGENET_MEAN, IMAGENET_STD, ArrayAugment, PixelsCHW, ToCHW, eval_transform,
                                      imagefolder_train, normalize_pixels)
from trainer.errors import ConfigError, DataError


# ---- the digits split --------------------------------------------------------------
def test_split_is_disjoint_complete_stratified_and_seeded():
    labels = np.repeat(np.arange(10), [178, 182, 177, 183, 181, 182, 181, 179, 174, 180])  # the digits' class sizes
    train, val, test = rdata.stratified_split(labels, 0.1, 0.2, seed=0)
    assert len(set(train) | set(val) | set(test)) == len(labels) == len(train) + len(val) + len(test)
    assert (len(val), len(test)) == (180, 360)
    for part, share in ((train, 0.7), (val, 0.1), (test, 0.2)):
        counts = np.bincount(labels[part], minlength=10)
        assert np.all(np.abs(counts - share * np.bincount(labels)) <= 1.5), counts
    again = rdata.stratified_split(labels, 0.1, 0.2, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip((train, val, test), again))
    assert not np.array_equal(test, rdata.stratified_split(labels, 0.1, 0.2, seed=1)[2])


def test_digits_render_as_three_channel_images_of_the_requested_size():
    images, labels = rdata.render_digits(32)
    assert images.shape == (1797, 32, 32, 3) and images.dtype == np.uint8 and labels.shape == (1797,)
    assert np.array_equal(images[..., 0], images[..., 2]) and images.max() == 255
    bundle = rdata.digits_data(ResNetOptions(depth=18))
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (1257, 180, 360)
    x, y = bundle.train[0]
    assert x.shape == (3, 32, 32) and x.dtype == np.uint8 and y.dtype == np.int64  # normalized on the device
    assert bundle.preprocess["class_names"] == [str(d) for d in range(10)] and bundle.preprocess["image_size"] == 32


def test_array_augment_shifts_without_changing_shape():
    np.random.seed(0)
    image = np.zeros((32, 32, 3), dtype="uint8")
    image[12:20, 12:20] = 255
    shifted = [ArrayAugment(pad=2, flip=False)(image) for _ in range(20)]
    assert all(s.shape == image.shape for s in shifted)
    assert all(s.sum() == image.sum() for s in shifted)  # the blob stays inside: a pure shift
    assert any(not np.array_equal(s, image) for s in shifted)


# ---- transforms on real files --------------------------------------------------------
def _write_images(folder, specs):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.RandomState(0)
    for name, mode, size in specs:
        array = rng.randint(0, 256, (size[1], size[0], 3)).astype("uint8")
        Image.fromarray(array).convert(mode).save(os.path.join(folder, name))


def test_transforms_on_png_and_jpeg_files_of_any_mode(tmp_path):
    from models.resnet.imagefolder import read_rgb

    _write_images(tmp_path, [("a.png", "RGB", (300, 200)), ("b.png", "L", (64, 97)), ("c.png", "RGBA", (50, 50)),
                             ("d.jpg", "RGB", (256, 256)), ("e.png", "P", (40, 30))])
    train, evaluate = imagefolder_train(224), eval_transform(224, 256)
    for name in "a.png b.png c.png d.jpg e.png".split():
        image = read_rgb(str(tmp_path / name))
        for t in (train, evaluate):
            out = t(image)
            assert out.shape == (3, 224, 224) and out.dtype == np.uint8
    small = eval_transform(32, 32)(read_rgb(str(tmp_path / "a.png")))
    assert small.shape == (3, 32, 32)


def test_to_chw_normalizes_with_the_imagenet_statistics():
    image = np.full((4, 5, 3), 128, dtype="uint8")
    out = ToCHW()(image)
    expected = (128 / 255 - np.asarray(IMAGENET_MEAN)) / np.asarray(IMAGENET_STD)
    assert out.shape == (3, 4, 5)
    np.testing.assert_allclose(out[:, 0, 0], expected, rtol=1e-5)


def test_device_normalization_equals_host_normalization_bitwise():
    images = np.random.RandomState(0).randint(0, 256, (3, 9, 7, 3)).astype("uint8")
    images[0, :, :, 1] = 0
    pixels = np.stack([PixelsCHW()(im) for im in images])
    assert pixels.dtype == np.uint8 and pixels.nbytes * 4 == np.stack([ToCHW()(im) for im in images]).nbytes
    on_device = normalize_pixels(paddle.to_tensor(pixels)).numpy()
    np.testing.assert_array_equal(on_device, np.stack([ToCHW()(im) for im in images]))
    gray = PixelsCHW()(np.full((2, 2), 7, dtype="uint8"))
    assert gray.shape == (3, 2, 2) and gray.dtype == np.uint8


def test_eval_transform_resizes_the_shorter_side_then_crops_the_center():
    image = np.zeros((200, 400, 3), dtype="uint8")
    image[:, 150:250] = 255  # a white band in the middle survives the center crop
    pixels = eval_transform(100, 100)(Image.fromarray(image))
    out = normalize_pixels(paddle.to_tensor(pixels[None]))[0].numpy()
    white = (1 - np.asarray(IMAGENET_MEAN)) / np.asarray(IMAGENET_STD)
    np.testing.assert_allclose(out[:, 50, 50], white, rtol=1e-4)
    assert out[0, 50, 0] < 0  # the left edge of the crop is black


# ---- ImageFolder ---------------------------------------------------------------------
def _folder(root, corrupt=True):
    for split, n in (("train", 4), ("val", 2)):
        for c in ("cat", "dog", "eel"):
            _write_images(os.path.join(root, split, c), [(f"{i}.png", "RGB", (36 + i, 40)) for i in range(n)])
    if corrupt:
        path = os.path.join(root, "train", "dog", "2.png")
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])  # truncated
        with open(os.path.join(root, "val", "eel", "1.png"), "wb") as f:
            f.write(b"not an image")
    return root


def test_imagefolder_classes_labels_and_layout_errors(tmp_path):
    root = _folder(str(tmp_path / "data"), corrupt=False)
    ds = ImageFolderDataset(os.path.join(root, "train"), eval_transform(32, 32))
    assert ds.classes == ["cat", "dog", "eel"] and len(ds) == 12
    assert list(ds.labels) == [0] * 4 + [1] * 4 + [2] * 4
    x, y = ds[5]
    assert x.shape == (3, 32, 32) and int(y) == 1
    os.makedirs(os.path.join(root, "val", "fox"))
    _write_images(os.path.join(root, "val", "fox"), [("0.png", "RGB", (8, 8))])
    with pytest.raises(DataError, match="fox"):
        ImageFolderDataset(os.path.join(root, "val"), eval_transform(32, 32), classes=ds.classes)
    with pytest.raises(DataError, match="does not exist"):
        ImageFolderDataset(str(tmp_path / "nowhere"), eval_transform(32, 32))
    os.makedirs(tmp_path / "empty" / "a")
    with pytest.raises(DataError, match="no image files"):
        ImageFolderDataset(str(tmp_path / "empty"), eval_transform(32, 32))


@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_images_are_skipped_and_counted_through_dataloader_workers(tmp_path, workers):
    root = _folder(str(tmp_path / "data"))
    ds = ImageFolderDataset(os.path.join(root, "train"), imagefolder_train(32), bad_images="skip")
    loader = paddle.io.DataLoader(ds, batch_size=4, shuffle=False, num_workers=workers)
    start = time.time()
    shapes = [tuple(x.shape) for x, _ in loader]
    assert time.time() - start < 60  # never hangs
    assert shapes == [(4, 3, 32, 32)] * 3  # batches keep their size: the next image stands in
    assert ds.has_bad() and ds.bad_paths() == [os.path.join(root, "train", "dog", "2.png")]
    callback = BadImages([ds], "skip", info={})
    callback._check()  # skip mode: no error


def test_fail_mode_names_the_file_in_one_line(tmp_path):
    root = _folder(str(tmp_path / "data"))
    ds = ImageFolderDataset(os.path.join(root, "val"), eval_transform(32, 32), classes=["cat", "dog", "eel"],
                            bad_images="fail")
    loader = paddle.io.DataLoader(ds, batch_size=3, shuffle=False, num_workers=2)
    assert len([b for b in loader]) == 2  # the loader itself never dies
    with pytest.raises(BadImageError) as info:
        BadImages([ds], "fail", info={})._check()
    message = str(info.value)
    assert os.path.join(root, "val", "eel", "1.png") in message and "\n" not in message


def test_bad_image_error_keeps_one_line_when_paddle_re_raises_it_with_a_traceback():
    worker_message = ("DataLoader worker(0) caught BadImageError with message:\nTraceback (most recent call last):\n"
                      '  File "x.py", line 1\nmodels.resnet.imagefolder.BadImageError: image /d/x.png cannot be read '
                      "(truncated): replace or delete the file\n")
    assert str(BadImageError(worker_message)) == "image /d/x.png cannot be read (truncated): replace or delete the file"


def test_a_folder_of_unreadable_files_stops_the_run_in_either_mode(tmp_path):
    folder = tmp_path / "junk" / "a"
    os.makedirs(folder)
    for i in range(MAX_CONSECUTIVE_BAD + 1):
        (folder / f"{i}.png").write_bytes(b"junk")
    ds = ImageFolderDataset(str(tmp_path / "junk"), eval_transform(32, 32), bad_images="skip")
    assert ds[0][0].shape == (3, 32, 32)
    with pytest.raises(DataError, match="in a row"):
        BadImages([ds], "skip", info={})._check()


# ---- CIFAR-10 ------------------------------------------------------------------------
def _cifar_archive(path, n_train=40, n_test=20):
    rng = np.random.RandomState(0)
    with tarfile.open(path, "w:gz") as tar:
        for name, n in (("data_batch_1", n_train), ("test_batch", n_test)):
            batch = {b"data": rng.randint(0, 256, (n, 3072)).astype("uint8"), b"labels": [i % 10 for i in range(n)]}
            blob = pickle.dumps(batch)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))


def test_cifar10_from_a_local_archive(tmp_path):
    _cifar_archive(str(tmp_path / rdata.CIFAR10_FILE))
    options = ResNetOptions(depth=18, dataset="cifar10", data_dir=str(tmp_path), val_fraction=0.25)
    bundle = rdata.build_datasets(options)
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (30, 10, 20)
    assert bundle.class_names[0] == "airplane" and bundle.train[0][0].shape == (3, 32, 32)
    with pytest.raises(DataError, match="does not exist"):
        rdata.build_datasets(ResNetOptions(depth=18, dataset="cifar10", data_dir=str(tmp_path / "none")))


def test_cifar10_offline_fails_fast_with_a_one_line_error(tmp_path, monkeypatch):
    import paddle.dataset.common

    monkeypatch.setattr(paddle.dataset.common, "DATA_HOME", str(tmp_path))  # nothing cached
    monkeypatch.setattr(rdata, "reachable", lambda host, port=443, timeout=3.0: False)  # never download in tests
    start = time.time()
    with pytest.raises(DataError, match="cannot be reached") as info:
        rdata.build_datasets(ResNetOptions(depth=18, dataset="cifar10"))
    assert time.time() - start < 10 and "\n" not in str(info.value)


def test_reachable_gives_up_quickly_on_a_closed_port():
    from helpers import free_port

    start = time.time()
    assert rdata.reachable("127.0.0.1", port=free_port(), timeout=patience(2.0)) is False
    assert time.time() - start < 3


# ---- options ---------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"depth": 20}, "depth=20"),
    ({"dataset": "imagefolder"}, "needs --data_dir"),
    ({"data_dir": "/no/such/dir"}, "not a directory"),
    ({"label_smoothing": 1.0}, "label_smoothing"),
    ({"image_size": 64, "resize_size": 32}, "resize_size"),
    ({"bad_images": "ignore"}, "skip or fail"),
    ({"pretrained": "/no/such.pdparams"}, "no such file"),
])
def test_bad_options_are_one_line_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match) as info:
        ResNetOptions(**kwargs)
    assert "\n" not in str(info.value)


def test_option_defaults_follow_the_dataset(tmp_path):
    assert (ResNetOptions().dataset, ResNetOptions().image_size) == ("digits", 32)
    folder = ResNetOptions(data_dir=str(tmp_path))
    assert (folder.dataset, folder.image_size, folder.resize_size) == ("imagefolder", 224, 256)


def test_dry_build_names_the_folder_classes_without_reading_an_image(tmp_path):
    """``ptrain run resnet50 --dry_run`` on an ImageFolder: the model and info of the full build,
    from the folder names alone (every image file here is unreadable, none is opened)."""
    from models.resnet.task import build, dry_build
    from trainer import TrainingArguments

    root = _folder(str(tmp_path / "data"), corrupt=False)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[])
    options = ResNetOptions(depth=18, data_dir=root, image_size=32)
    full = build(options, args)
    for split in ("train", "val"):  # now no file of the tree can be decoded
        for c in ("cat", "dog", "eel"):
            for name in os.listdir(os.path.join(root, split, c)):
                with open(os.path.join(root, split, c, name), "wb") as f:
                    f.write(b"not an image")
    dry = dry_build(options, args)
    assert dry.train_dataset is None and dry.eval_dataset is None and dry.test_dataset is None
    assert {k: full.info[k] for k in dry.info} == dry.info and dry.info["num_classes"] == 3
    assert dry.info["parameters"] == full.info["parameters"] == sum(
        int(np.prod(p.shape)) for p in dry.model.parameters() if not p.stop_gradient)
    assert "train_samples" not in dry.info
    os.rename(os.path.join(root, "val"), os.path.join(root, "valid"))
    with pytest.raises(DataError, match="val does not exist"):
        dry_build(options, args)
