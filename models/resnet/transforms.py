"""Image transforms: what the network sees, in training and at evaluation.

Training and evaluation pipelines end in :class:`PixelsCHW`, which returns
the **uint8** pixels in CHW layout: DataLoader workers hand 1 byte per value to
the shared-memory queue (a batch of 128 ImageNet crops is 19 MB instead of the
77 MB of float32), and the network normalizes on the device
(:func:`normalize_pixels`, called by ``models.resnet.model.ResNet`` when its
input is uint8). :class:`ToCHW` normalizes on the host for ``ptrain predict``,
whose exported model takes normalized float32.

* ``imagefolder_train``: RandomResizedCrop(size), horizontal flip (the standard
  ImageNet augmentation).
* ``eval_transform``: resize the shorter side to ``resize``, center crop
  ``size`` (ImageNet: 256 then 224). ``ptrain predict`` applies it to image
  files, reading the sizes from ``preprocess.json``, with ``ToCHW`` last.
* ``ArrayAugment``: for in-memory uint8 images (digits, CIFAR-10): a random
  crop from a zero-padded copy, plus an optional flip (not for digits).

    >>> import numpy as np
    >>> PixelsCHW()(np.zeros((4, 4, 3), dtype="uint8")).shape
    (3, 4, 4)
    >>> ToCHW()(np.zeros((4, 4, 3), dtype="uint8")).dtype
    dtype('float32')
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import paddle
import paddle.vision.transforms as T

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ToCHW:
    """HWC uint8 (PIL image or array) -> CHW float32, ``(x / 255 - mean) / std``."""

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD):
        self.scale = (1.0 / (255.0 * np.asarray(std, dtype="float32"))).reshape(3, 1, 1)
        self.shift = (np.asarray(mean, dtype="float32") / np.asarray(std, dtype="float32")).reshape(3, 1, 1)

    def __call__(self, image) -> np.ndarray:
        array = np.asarray(image, dtype="float32")
        if array.ndim == 2:  # grayscale
            array = np.repeat(array[:, :, None], 3, axis=2)
        return np.ascontiguousarray(array.transpose(2, 0, 1) * self.scale - self.shift, dtype="float32")


class PixelsCHW:
    """HWC uint8 (PIL image or array) -> CHW uint8 (grayscale repeated to 3 channels); no normalization."""

    def __call__(self, image) -> np.ndarray:
        array = np.asarray(image, dtype="uint8")
        if array.ndim == 2:  # grayscale
            array = np.repeat(array[:, :, None], 3, axis=2)
        return np.ascontiguousarray(array.transpose(2, 0, 1))


@paddle.jit.not_to_static  # eager only: an export takes normalized float32 and never runs this
def normalize_pixels(pixels: paddle.Tensor, mean: Sequence[float] = IMAGENET_MEAN,
                     std: Sequence[float] = IMAGENET_STD) -> paddle.Tensor:
    """NCHW uint8 pixels -> float32 ``(x / 255 - mean) / std``, computed where ``pixels`` are (the device).

    The same arithmetic as :class:`ToCHW` (``x * scale - shift`` in float32), so
    a model sees the values it would have seen from host-normalized batches.
    """
    key = (str(pixels.place), tuple(mean), tuple(std))
    if key not in _DEVICE_CONSTANTS:  # made once per device: no host-to-device copy per step
        std32 = np.asarray(std, dtype="float32")
        scale = (1.0 / (255.0 * std32)).reshape(1, 3, 1, 1)
        shift = (np.asarray(mean, dtype="float32") / std32).reshape(1, 3, 1, 1)
        _DEVICE_CONSTANTS[key] = (paddle.to_tensor(scale, place=pixels.place), paddle.to_tensor(shift, place=pixels.place))
    scale, shift = _DEVICE_CONSTANTS[key]
    return pixels.astype("float32") * scale - shift


_DEVICE_CONSTANTS: dict = {}


def imagefolder_train(size: int) -> T.Compose:
    """RandomResizedCrop(size, scale 0.08-1), horizontal flip; uint8 CHW out (PIL input)."""
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), PixelsCHW()])


def eval_transform(size: int, resize: int) -> T.Compose:
    """Shorter side to ``resize``, center crop ``size``; uint8 CHW out (PIL input)."""
    return T.Compose([T.Resize(resize), T.CenterCrop(size), PixelsCHW()])


class ArrayAugment:
    """Random crop of an HWC uint8 array from a copy zero-padded by ``pad`` pixels
    on each side, and a horizontal flip with probability 0.5 when ``flip``.
    Uses numpy's global RNG (seeded by the Trainer and by paddle's workers)."""

    def __init__(self, pad: int, flip: bool):
        self.pad, self.flip = int(pad), bool(flip)

    def __call__(self, image: np.ndarray) -> np.ndarray:
        if self.pad:
            h, w = image.shape[:2]
            p = self.pad
            padded = np.zeros((h + 2 * p, w + 2 * p) + image.shape[2:], dtype=image.dtype)
            padded[p:p + h, p:p + w] = image
            top, left = np.random.randint(0, 2 * p + 1, size=2)
            image = padded[top:top + h, left:left + w]
        if self.flip and np.random.rand() < 0.5:
            image = image[:, ::-1]
        return image
