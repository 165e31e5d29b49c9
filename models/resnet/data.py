"""Datasets of the ResNet task: the embedded digits, an ImageFolder tree, CIFAR-10.

* ``digits`` (default, embedded): scikit-learn's 1,797 real 8x8 digits,
  rendered once (bilinear upsampling) as 3-channel uint8 images of
  ``image_size`` pixels, split train/val/test with a fixed seed, stratified
  by class.
* ``imagefolder``: ``DATA_DIR/train/<class>/*`` and ``DATA_DIR/val/<class>/*``
  (and ``DATA_DIR/test/`` when present; otherwise the test set is ``val/``),
  see :mod:`models.resnet.imagefolder`, decoded by ``options.data_backend``:
  ``turbo`` (default: libjpeg-turbo at a reduced DCT scale + OpenCV,
  Pillow for other files, :mod:`models.resnet.turbo`), ``pillow`` (Pillow +
  ``paddle.vision.transforms``) or ``dali`` (NVIDIA DALI, :mod:`models.resnet.dali`).
* ``cifar10``: ``paddle.vision.datasets.Cifar10`` from a local
  ``cifar-10-python.tar.gz`` (``--data_dir`` the file or its folder, or
  paddle's cache); downloads only when the server answers within seconds,
  otherwise a one-line error says where to put the file. A seeded,
  stratified slice of the training set is the validation set; the official
  test set is the test set.

``build_datasets(options)`` returns a :class:`DataBundle` with the three
datasets, the class names and the preprocessing ``ptrain predict`` repeats.
Every dataset yields uint8 CHW images: the model normalizes them on the
device (``models.resnet.transforms.normalize_pixels``).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlparse

import numpy as np
import paddle

from models import splits
from models.digits.data import digits_arrays
from trainer.errors import DataError

from .folder_listing import find_classes
from .imagefolder import MAX_IMAGE_PIXELS, ImageFolderDataset
from .turbo import TurboImageFolder, TurboTransform
from .transforms import IMAGENET_MEAN, IMAGENET_STD, ArrayAugment, PixelsCHW, eval_transform, imagefolder_train

logger = logging.getLogger("models.resnet")

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR10_FILE = "cifar-10-python.tar.gz"


class ArrayImageDataset(paddle.io.Dataset):
    """(CHW uint8 image, int64 label) pairs from in-memory HWC uint8 images (the model normalizes on the device)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, augment: Optional[ArrayAugment] = None):
        self.images = np.ascontiguousarray(images, dtype="uint8")
        self.labels = np.ascontiguousarray(labels, dtype="int64")
        self.augment = augment
        self.to_chw = PixelsCHW()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        image = self.images[i]
        if self.augment is not None:
            image = self.augment(image)
        return self.to_chw(image), self.labels[i]


@dataclass
class DataBundle:
    train: Any
    val: Any
    test: Any
    class_names: List[str]
    preprocess: Dict[str, Any]            # saved next to the inference model for ``ptrain predict``
    info: Dict[str, Any] = field(default_factory=dict)


def stratified_split(labels: np.ndarray, val_fraction: float, test_fraction: float,
                     seed: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Disjoint, sorted train/val/test index arrays covering ``labels``; each class
    keeps its share in every part; the same seed gives the same split (:mod:`models.splits`)."""
    return tuple(np.sort(part) for part in splits.stratified_split(labels, val_fraction, test_fraction, seed))


def render_digits(size: int) -> Tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``(N, size, size, 3)`` uint8 images (ink bright) and int64 labels."""
    from PIL import Image

    pixels, labels = digits_arrays()
    small = np.clip(np.rint(pixels.reshape(-1, 8, 8) * (255.0 / 16.0)), 0, 255).astype("uint8")
    big = np.stack([np.asarray(Image.fromarray(im, mode="L").resize((size, size), Image.BILINEAR)) for im in small])
    return np.repeat(big[..., None], 3, axis=3), labels


def _preprocess(size: int, resize: int, class_names: Sequence[str], dataset: str) -> Dict[str, Any]:
    return {"dataset": dataset, "image_size": size, "resize_size": resize, "mean": list(IMAGENET_MEAN),
            "std": list(IMAGENET_STD), "class_names": list(class_names)}


def digits_data(options) -> DataBundle:
    images, labels = render_digits(options.image_size)
    train, val, test = stratified_split(labels, options.val_fraction, options.test_fraction, options.split_seed)
    augment = ArrayAugment(pad=max(1, options.image_size // 16), flip=False) if options.augment else None
    names = [str(d) for d in range(10)]
    return DataBundle(ArrayImageDataset(images[train], labels[train], augment),
                      ArrayImageDataset(images[val], labels[val]),
                      ArrayImageDataset(images[test], labels[test]), names,
                      _preprocess(options.image_size, options.image_size, names, "digits"))


def imagefolder_data(options) -> DataBundle:
    train_dir, val_dir, test_dir = _folder_dirs(options.data_dir)
    size, resize = options.image_size, options.resize_size
    backend = getattr(options, "data_backend", "turbo")
    if backend == "dali":
        from .dali import DaliImageFolder as Folder
    else:  # turbo: batches assembled in place; pillow: one sample at a time, collated by the loader
        Folder = TurboImageFolder if backend == "turbo" else ImageFolderDataset
    train_t, eval_t = _folder_transforms(backend, size, resize, options.augment)
    bad = {"bad_images": options.bad_images, "max_pixels": getattr(options, "max_image_pixels", MAX_IMAGE_PIXELS)}
    train = Folder(train_dir, train_t, **bad)
    classes = train.classes
    val = Folder(val_dir, eval_t, classes=classes, **bad)
    has_test = os.path.isdir(test_dir)
    test = Folder(test_dir, eval_t, classes=classes, **bad) if has_test else val
    return DataBundle(train, val, test, classes, _preprocess(size, resize, classes, "imagefolder"),
                      info={"test_split": "test" if has_test else "val (no test/ folder)"})


def _folder_transforms(backend: str, size: int, resize: int, augment: bool):
    """(training, evaluation) transforms of an ImageFolder tree; without ``augment`` training uses the evaluation one."""
    if backend == "pillow":
        train, evaluate = imagefolder_train(size), eval_transform(size, resize)
    else:  # turbo, and dali's per-sample path (a bad batch, __getitem__)
        train, evaluate = TurboTransform.for_training(size), TurboTransform.for_evaluation(size, resize)
    return (train if augment else evaluate), evaluate


def cifar10_data(options) -> DataBundle:
    path = _cifar10_file(options.data_dir)
    from paddle.vision.datasets import Cifar10

    parts = []
    for mode in ("train", "test"):
        try:
            ds = Cifar10(data_file=path, mode=mode, download=False, backend="cv2")
        except Exception as exc:  # noqa: BLE001 - a damaged archive: name the file
            raise DataError(f"{path} is not a readable CIFAR-10 archive ({type(exc).__name__}: {exc}): "
                            f"download {CIFAR10_FILE} again") from None
        x = np.stack([np.asarray(img, dtype="uint8") for img, _ in ds.data]).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        parts.append((x, np.asarray([int(label) for _, label in ds.data], dtype="int64")))
    (x_train, y_train), (x_test, y_test) = parts
    size = options.image_size
    if size != 32:
        from PIL import Image

        def resize(x):
            return np.stack([np.asarray(Image.fromarray(im).resize((size, size), Image.BILINEAR)) for im in x])
        x_train, x_test = resize(x_train), resize(x_test)
    train, val, _ = stratified_split(y_train, options.val_fraction, 0.0, options.split_seed)
    augment = ArrayAugment(pad=max(1, size // 8), flip=True) if options.augment else None
    return DataBundle(ArrayImageDataset(x_train[train], y_train[train], augment),
                      ArrayImageDataset(x_train[val], y_train[val]),
                      ArrayImageDataset(x_test, y_test), list(CIFAR10_CLASSES),
                      _preprocess(size, size, CIFAR10_CLASSES, "cifar10"))


def _cifar10_file(data_dir: Optional[str]) -> str:
    """The local CIFAR-10 archive; download it only when the server answers quickly."""
    from paddle.dataset.common import DATA_HOME
    from paddle.vision.datasets.cifar import CIFAR10_MD5, CIFAR10_URL

    if data_dir:
        path = data_dir if os.path.isfile(data_dir) else os.path.join(data_dir, CIFAR10_FILE)
        if not os.path.isfile(path):
            raise DataError(f"{path} does not exist: put {CIFAR10_FILE} ({CIFAR10_URL}) there or give its path as --data_dir")
        return path
    cached = os.path.join(DATA_HOME, "cifar", CIFAR10_FILE)
    if os.path.isfile(cached):
        return cached
    host = urlparse(CIFAR10_URL).hostname
    if not reachable(host):
        raise DataError(f"CIFAR-10 is not in {cached} and {host} cannot be reached (offline?): download {CIFAR10_URL} "
                        "elsewhere and pass --data_dir PATH_TO_THE_FILE")
    from paddle.dataset.common import download

    logger.info("downloading %s to %s", CIFAR10_URL, cached)
    return download(CIFAR10_URL, "cifar", CIFAR10_MD5)


def reachable(host: Optional[str], port: int = 443, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to ``host:port`` opens within ``timeout`` seconds (downloads never hang)."""
    if not host:
        return False
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def build_datasets(options) -> DataBundle:
    """The datasets ``options.dataset`` names (see the module docstring)."""
    builders = {"digits": digits_data, "imagefolder": imagefolder_data, "cifar10": cifar10_data}
    return builders[options.dataset](options)


def class_names(options) -> List[str]:
    """The class names ``build_datasets(options)`` would find, without reading an image
    (``ptrain run resnet50 --dry_run``): the digits, CIFAR-10's classes, or the sorted
    class folders of ``data_dir/train`` (checked as ``imagefolder_data`` checks them)."""
    if options.dataset == "digits":
        return [str(d) for d in range(10)]
    if options.dataset == "cifar10":
        return list(CIFAR10_CLASSES)
    return find_classes(_folder_dirs(options.data_dir)[0])


def _folder_dirs(root: str) -> Tuple[str, str, str]:
    """``root``'s train/, val/ and test/ folders; train/ and val/ must exist."""
    train_dir, val_dir, test_dir = (os.path.join(root, d) for d in ("train", "val", "test"))
    for d in (train_dir, val_dir):
        if not os.path.isdir(d):
            raise DataError(f"{d} does not exist: --data_dir must hold train/ and val/, each with one folder per class "
                            "(the ImageNet layout)")
    return train_dir, val_dir, test_dir


def preprocess_for(options, names: Sequence[str]) -> Dict[str, Any]:
    """What ``DataBundle.preprocess`` holds for ``options`` and these class names."""
    return _preprocess(options.image_size, options.resize_size, names, options.dataset)

