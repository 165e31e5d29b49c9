"""The JPEG image sets the input-pipeline benchmarks read, generated with a fixed seed (nothing downloads).

* ``textured``: 500x375 (ImageNet's average size), quality 90, a colour
  gradient under a noise texture (luminance noise sigma 20, chroma noise
  sigma 7): ~90 KB a file, ~3.9 bits per pixel, the entropy of real photos
  (ImageNet's training JPEGs average ~110 KB at ~400x350). Entropy decoding
  is then most of a decode, as it is on photos.
* ``mixed``: the same texture at mixed ImageNet-like sizes, each side drawn
  from 300-1,200 px: about half of the RandomResizedCrop boxes are large
  enough for a reduced DCT scale (1/2 or 1/4).
* ``smooth``: the earlier benchmark images (~500x375 varying, smooth colour
  fields plus mild noise, sigma 12): they decode ~1.6x faster than
  ``textured``, so the work after the decode weighs more.

Every set is cut from one noise tile per seed at random offsets (fast to
generate at any size), and is the same files for the same seed and count.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     len(generate_jpegs(root, 2, kind="textured"))
    2
"""

from __future__ import annotations

import os
from typing import List

SETS = ("textured", "mixed", "smooth")
QUALITY = 90


def _size(rng, kind: str, scale: float):
    if kind == "textured":
        return int(375 * scale), int(500 * scale)
    if kind == "mixed":
        h, w = rng.randint(300, 1201, size=2)
        return int(h * scale), int(w * scale)
    return int(rng.randint(300, 450) * scale), int(rng.randint(400, 600) * scale)


def generate_jpegs(root: str, count: int, classes: int = 4, seed: int = 0, scale: float = 1.0,
                   kind: str = "smooth") -> List[str]:
    """``count`` JPEGs of the set ``kind`` (see the module docstring) under ``root/class_<k>/``; their paths."""
    import numpy as np
    from PIL import Image

    if kind not in SETS:
        raise ValueError(f"image set {kind!r}: choose from {', '.join(SETS)}")
    rng = np.random.RandomState(seed)
    sigma, chroma = (12.0, 0.0) if kind == "smooth" else (20.0, 7.0)
    tile_h, tile_w = (int(600 * scale), int(800 * scale)) if kind != "mixed" else (int(1300 * scale),) * 2
    # cut at random offsets per image; smooth: the earlier generator's draws (noise in each channel), same files
    luma = rng.normal(0, sigma, size=(tile_h, tile_w, 3 if kind == "smooth" else 1)).astype("float32")
    colour = rng.normal(0, chroma, size=(tile_h, tile_w, 3)).astype("float32") if chroma else 0.0
    for k in range(classes):
        os.makedirs(os.path.join(root, f"class_{k}"), exist_ok=True)
    paths = []
    for i in range(count):
        h, w = _size(rng, kind, scale)
        yy, xx = np.mgrid[0:h, 0:w].astype("float32") / scale
        base = rng.uniform(0, 255, size=3) if kind == "smooth" else rng.uniform(40, 215, size=3)
        slope = rng.uniform(-0.4, 0.4, size=(3, 2)) * (1.0 if kind == "smooth" else 500.0 / max(h, w))
        img = np.stack([base[c] + slope[c, 0] * yy + slope[c, 1] * xx for c in range(3)], axis=2)
        y0, x0 = int(rng.randint(0, tile_h - h + 1)), int(rng.randint(0, tile_w - w + 1))
        img += luma[y0:y0 + h, x0:x0 + w]
        if chroma:
            img += colour[y0:y0 + h, x0:x0 + w]
        path = os.path.join(root, f"class_{i % classes}", f"img_{i:05d}.jpg")
        Image.fromarray(np.clip(img, 0, 255).astype("uint8")).save(path, quality=QUALITY)
        paths.append(path)
    return paths


def make_tree(root: str, count: int, seed: int = 0, scale: float = 1.0, kind: str = "smooth") -> None:
    """``root/train/class_k/*.jpg`` and ``root/val`` (a link to the same files)."""
    generate_jpegs(os.path.join(root, "train"), count, seed=seed, scale=scale, kind=kind)
    os.symlink("train", os.path.join(root, "val"))
