"""Crop boxes: where the training and evaluation transforms cut an image, in source pixels.

Every ImageFolder backend (Pillow + ``paddle.vision``, libjpeg-turbo + OpenCV,
DALI) cuts the same boxes, so they differ only in how they decode and resize:

* :func:`random_resized_crop_box`: ``paddle.vision.transforms.RandomResizedCrop``'s
  box (area share 0.08-1, aspect ratio 3/4-4/3 on a log scale, 10 attempts,
  then the central crop), with the same draws from numpy's and python's
  global RNGs (seeded per sample by the Trainer, so resumed runs cut the same
  boxes).
* :func:`center_crop_box`: ``Resize(resize)`` then ``CenterCrop(size)``
  (``paddle.vision``'s rounding) as the box of the source image that ends up
  in the output.

A box is ``(top, left, height, width)``; the center box is in float pixels
(it is a fraction of a resized image), the random box in whole pixels.

    >>> center_crop_box(512, 512, size=224, resize=256)
    (32.0, 32.0, 448.0, 448.0)
"""

from __future__ import annotations

import math
import random
from typing import Sequence, Tuple

import numpy as np

SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)
_LOG_RATIO = (math.log(RATIO[0]), math.log(RATIO[1]))


def random_resized_crop_box(height: int, width: int, scale: Sequence[float] = SCALE,
                            ratio: Sequence[float] = RATIO, attempts: int = 10) -> Tuple[int, int, int, int]:
    """``RandomResizedCrop``'s ``(top, left, h, w)`` for an image of ``height`` x ``width`` pixels."""
    area = height * width
    log_ratio = _LOG_RATIO if tuple(ratio) == RATIO else (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(attempts):
        target_area = np.random.uniform(*scale) * area
        aspect = math.exp(np.random.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return random.randint(0, height - h), random.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def center_crop_box(height: int, width: int, size: int, resize: int) -> Tuple[float, float, float, float]:
    """The part of a ``height`` x ``width`` image that ``Resize(resize)`` + ``CenterCrop(size)`` keep."""
    if (width <= height and width == resize) or (height <= width and height == resize):
        out_h, out_w = height, width  # paddle.vision leaves the image as it is
    elif width < height:
        out_w, out_h = resize, int(resize * height / width)
    else:
        out_h, out_w = resize, int(resize * width / height)
    top = int(round((out_h - size) / 2.0))
    left = int(round((out_w - size) / 2.0))
    fy, fx = height / out_h, width / out_w
    return top * fy, left * fx, size * fy, size * fx


def flip_coin() -> bool:
    """``RandomHorizontalFlip``'s draw (python's ``random``, p = 0.5)."""
    return random.random() < 0.5
