"""The fast ImageFolder pipeline (``--data_backend turbo``, the default): of each
JPEG only the crop box decoded (or the whole image at a reduced DCT scale) by
libjpeg-turbo, then resized by OpenCV, straight into the batch.

Per JPEG file (:meth:`TurboTransform.from_file`):

1. read the header (``simplejpeg.decode_jpeg_header``: size and colour space);
2. cut the box in source pixels (:mod:`models.resnet.crops`: the very box
   ``RandomResizedCrop`` or ``Resize`` + ``CenterCrop`` would cut);
3. decode at the smallest DCT scale (1/2, 1/4 or 1/8: :func:`dct_scale`) that
   still leaves this sample's box at least the output size in both directions:
   a small crop of a large photo decodes at 1/2 or 1/4 of its size, 4-16x
   fewer pixels. A box that needs the full size is decoded alone (a region
   decode, :mod:`models.resnet.jpeg_regions`: nvImageCodec's libjpeg-turbo
   skips the IDCT and colour conversion outside the box and stops after its
   last row; the same pixels as the whole image cut to the box), else, without
   nvImageCodec or for a file it does not decode, the whole image. Training
   decodes with libjpeg-turbo's fast IDCT and chroma upsampling (+25%; the
   augmentation moves pixels far more); evaluation with the accurate ones;
4. crop first, then one antialiased resize of the crop to the output size
   (:func:`resize_antialiased`: OpenCV SIMD), flip (training), uint8 CHW out
   (``cv2.split`` into the three planes of the output: faster than a
   transposed copy). The model normalizes on the device as with every other
   backend.

:class:`TurboImageFolder` (the dataset of this backend) assembles batches in
place: its ``__getitems__`` writes each image straight into its slot of one
``(B, 3, size, size)`` uint8 array and hands the loader that array
(``trainer.data.batch.AssembledBatch``), so no per-sample arrays are stacked
again, in the training process or in a DataLoader worker, and it region-decodes
all the batch's full-size boxes in one call. The RNG draws are those of
one-by-one decoding, in the same order; only a file the region decode fails on
is decoded one by one after the rest, with new draws (deterministic still, so
resumed runs match).

What is left of a decode is the entropy (Huffman) decoding of every row above
the box's last one: a JPEG without restart markers has no random access, and on
photo-like images that is most of a decode (``python -m benchmarks dataloader``
reports this floor beside the decoder alone).

Pillow stays the fallback for everything else: other formats (PNG, BMP,
...), CMYK/YCCK JPEGs, and any JPEG libjpeg-turbo will not decode strictly
(truncated, damaged). Pillow then decides: an image it reads goes through
the same crop and resize; one it cannot read raises
:class:`~models.resnet.imagefolder.BadImageError`, and the dataset's
bad-image handling (skip or fail) takes over as before.

OpenCV is limited to one thread per process (``cv2.setNumThreads(1)``, set on
first use): DataLoader workers are the parallelism, and a pool per worker only
costs CPU time.

    >>> import numpy as np
    >>> TurboTransform.for_evaluation(32, 36)(np.zeros((40, 50, 3), dtype="uint8")).shape
    (3, 32, 32)
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from trainer.data.batch import AssembledBatch, batch_array

from . import jpeg_regions
from .crops import center_crop_box, flip_coin, random_resized_crop_box
from .imagefolder import MAX_IMAGE_PIXELS, ImageFolderDataset, read_rgb

JPEG_MAGIC = b"\xff\xd8"
TURBO_COLORSPACES = ("YCbCr", "Gray", "RGB")  # CMYK and YCCK go to Pillow
_cv2 = None


def _opencv():
    global _cv2
    if _cv2 is None:
        import cv2

        cv2.setNumThreads(1)
        _cv2 = cv2
    return _cv2


class TurboTransform:
    """Decode (JPEG at a reduced DCT scale, else Pillow), crop, resize, [flip]; uint8 CHW out.

    Use :meth:`for_training` (RandomResizedCrop + horizontal flip) or :meth:`for_evaluation`
    (shorter side to ``resize``, center crop ``size``). Called on a PIL image
    or an HWC uint8 array it does the same crop/resize without the decoding.
    """

    def __init__(self, size: int, resize: Optional[int], train: bool):
        self.size, self.resize, self.train = int(size), resize, bool(train)

    @classmethod
    def for_training(cls, size: int) -> "TurboTransform":
        return cls(size, None, train=True)

    @classmethod
    def for_evaluation(cls, size: int, resize: int) -> "TurboTransform":
        return cls(size, resize, train=False)

    def box(self, height: int, width: int) -> Tuple[float, float, float, float]:
        if self.train:
            return random_resized_crop_box(height, width)
        return center_crop_box(height, width, self.size, self.resize)

    def from_file(self, path: str, out: Optional[np.ndarray] = None, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
        """The file's pixels, uint8 CHW; written into ``out`` (``(3, size, size)`` uint8) when given.
        BadImageError naming the file when it cannot be read or its header says more than ``max_pixels``."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            data = b""  # missing or unreadable: read_rgb below names the file (BadImageError)
        if data[:2] == JPEG_MAGIC:
            pixels = self._decode_jpeg(data, out, max_pixels)
            if pixels is not None:
                return pixels
        # Pillow: other formats, CMYK, damaged or oversized JPEGs (BadImageError if unreadable or over max_pixels)
        return self(read_rgb(path, max_pixels=max_pixels), out)

    def _decode_jpeg(self, data: bytes, out: Optional[np.ndarray], max_pixels: int) -> Optional[np.ndarray]:
        planned = self.plan(data, max_pixels)
        if planned is None:
            return None
        height, width, box, flip = planned
        if dct_scale(box[2], box[3], self.size) == 1 and jpeg_regions.available() and jpeg_regions.complete(data):
            crop, = jpeg_regions.decode_regions([data], [pixel_region(box, height, width)], fast=self.train)
            if crop is not None:  # the box alone: the same pixels as the whole image cut to it
                return self.finish_crop(crop, flip, out)
        try:
            image, scaled_box = self.decode_scaled(data, height, width, box)
        except ValueError:  # truncated or damaged: Pillow decides
            return None
        return self._finish(image, scaled_box, flip, out)

    def plan(self, data: bytes, max_pixels: int = MAX_IMAGE_PIXELS):
        """``(height, width, box, flip)`` of a JPEG that libjpeg-turbo decodes (read from its header; the
        box and flip drawn as Pillow's path draws them), or None for one Pillow must decode (CMYK, ...) or
        refuse (its header says more than ``max_pixels``, 0: no limit); then nothing is drawn."""
        import simplejpeg

        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            return None
        if colorspace not in TURBO_COLORSPACES or height < 1 or width < 1 or (max_pixels and height * width > max_pixels):
            return None
        box = self.box(height, width)  # drawn before decoding: the RNG use matches Pillow's path
        return height, width, box, self.train and flip_coin()

    def decode_scaled(self, data: bytes, height: int, width: int, box):
        """The JPEG decoded at :func:`dct_scale` of ``box`` (libjpeg-turbo), and ``box`` in its pixels.
        ValueError when libjpeg-turbo reports any error or warning (a truncated file)."""
        import simplejpeg

        scale = dct_scale(box[2], box[3], self.size)
        image = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=-(-height // scale),
                                       min_width=-(-width // scale), fastdct=self.train, fastupsample=self.train)
        fy, fx = image.shape[0] / height, image.shape[1] / width
        top, left, h, w = box
        return image, (top * fy, left * fx, h * fy, w * fx)

    def __call__(self, image, out: Optional[np.ndarray] = None) -> np.ndarray:
        array = np.asarray(image, dtype="uint8")
        if array.ndim == 2:
            array = np.repeat(array[:, :, None], 3, axis=2)
        box = self.box(array.shape[0], array.shape[1])
        return self._finish(array, box, self.train and flip_coin(), out)

    def _finish(self, image: np.ndarray, box, flip: bool, out: Optional[np.ndarray] = None) -> np.ndarray:
        y0, x0, y1, x1 = pixel_region(box, image.shape[0], image.shape[1])
        return self.finish_crop(image[y0:y1, x0:x1], flip, out)

    def finish_crop(self, crop: np.ndarray, flip: bool, out: Optional[np.ndarray] = None) -> np.ndarray:
        """The cut-out box (HWC uint8) resized, [flipped,] as uint8 CHW (into ``out`` when given)."""
        hwc = resize_antialiased(crop, self.size)
        cv2 = _opencv()
        if flip:
            hwc = cv2.flip(hwc, 1)
        chw = np.empty((3, self.size, self.size), dtype="uint8") if out is None else out
        mv = [chw[0], chw[1], chw[2]]
        planes = cv2.split(hwc, mv)  # into the planes: no per-plane arrays, no np.stack copy
        if planes[0] is not mv[0]:  # OpenCV allocated planes of its own after all
            chw[...] = planes
        return chw


def pixel_region(box, height: int, width: int) -> Tuple[int, int, int, int]:
    """``(y0, x0, y1, x1)``: the whole pixels of an image of ``height`` x ``width`` that ``box`` cuts (at least one)."""
    top, left, h, w = box
    y0, x0 = int(round(top)), int(round(left))
    y1 = min(height, max(y0 + 1, int(round(top + h))))
    x1 = min(width, max(x0 + 1, int(round(left + w))))
    return y0, x0, y1, x1


def dct_scale(height: float, width: float, size: int) -> int:
    """The largest of 8, 4, 2 (else 1) by which a ``height`` x ``width`` box can shrink and still cover ``size`` pixels.

    Only the power-of-two scales: libjpeg-turbo's 1/2, 1/4 and 1/8 IDCTs are
    2-6x faster than a full decode, while 7/8 .. 3/8 cost as much as the full one.

    >>> dct_scale(1000, 600, 224), dct_scale(300, 300, 224)
    (2, 1)
    """
    for k in (8, 4, 2):
        if height >= k * size and width >= k * size:
            return k
    return 1


def resize_antialiased(image: np.ndarray, size: int) -> np.ndarray:
    """``image`` (HWC uint8) to ``size`` x ``size``, low-pass filtered first when it shrinks by 1.25x or more.

    After the DCT-domain reduction the remaining factor ``r`` is below 2 along
    the box's shorter side and below 2.67 along the other (a box's sides differ
    by 4/3 at most). Per axis: for 1.25 <= r < 2, OpenCV's fixed-point 3-tap
    Gaussian ([1, 2, 1] / 4, sigma ~0.85: the footprint of an output pixel at
    r = 2); for 2 <= r < 3 its 5-tap one ([1, 4, 6, 4, 1] / 16, sigma ~1.1);
    then bilinear interpolation. Below 1.25 bilinear alone (the ideal
    prefilter's sigma, sqrt(r**2 - 1) / 2, is under 0.4 pixel). These are SIMD
    kernels, together 2-3x faster than ``INTER_AREA``'s generic (non-integer)
    path, as free of aliasing (a 1-pixel checkerboard comes out flat) and closer
    to Pillow's antialiased bilinear (0.8/255 against INTER_AREA's 1.3/255 at
    2 <= r < 3 on a noise texture). Factors of 3 and more (a huge image at 1/8,
    or one Pillow decoded) use ``INTER_AREA``; enlargements are bilinear.
    """
    cv2 = _opencv()
    ry, rx = image.shape[0] / size, image.shape[1] / size
    if ry >= 3 or rx >= 3:
        return cv2.resize(image, (size, size), interpolation=cv2.INTER_AREA)
    if ry >= 1.25 or rx >= 1.25:  # on a contiguous copy of the crop: ~15% faster than on the view
        image = cv2.GaussianBlur(np.ascontiguousarray(image), (_taps(rx), _taps(ry)), 0)
    return cv2.resize(image, (size, size), interpolation=cv2.INTER_LINEAR)


def _taps(r: float) -> int:
    """The Gaussian prefilter's width along an axis that shrinks by ``r`` (< 3): 5, 3 or 1 (none)."""
    return 5 if r >= 2 else 3 if r >= 1.25 else 1


class TurboImageFolder(ImageFolderDataset):
    """:class:`~models.resnet.imagefolder.ImageFolderDataset` of a :class:`TurboTransform`, whose
    ``__getitems__(indices)`` writes the batch's images straight into one ``(B, 3, size, size)`` uint8
    array (bad images skipped or failed as one by one). Returns the samples (views of that array, with
    their labels) as an :class:`~trainer.data.batch.AssembledBatch` of ``[images, labels]``: what
    ``default_collate_fn`` would build, without building it again."""

    def __init__(self, root: str, transform: TurboTransform, **kwargs):
        if not isinstance(transform, TurboTransform):
            raise TypeError(f"TurboImageFolder needs a TurboTransform, not {type(transform).__name__}")
        super().__init__(root, transform, **kwargs)
        self.region_decoded = 0  # images of this process's batches decoded box only (nvImageCodec)
        # the decoders imported here, once: forked DataLoader workers inherit them (~70 ms of CPU each, every epoch)
        jpeg_regions.available()
        _opencv()

    def __getitems__(self, indices):
        size, transform = self.transform.size, self.transform
        images = batch_array((len(indices), 3, size, size), "uint8")  # in a worker: in the batch's shared slot
        labels = np.empty(len(indices), dtype="int64")
        regions = []  # (slot, index, file bytes, pixel region, flip): decoded together below
        use_regions = jpeg_regions.available()
        for k, i in enumerate(indices):
            planned = self._plan_region(int(i), images[k]) if use_regions else None
            if planned is None:  # one by one, into its slot: other files, bad ones, no nvImageCodec
                labels[k] = self.sample(int(i), out=images[k])[1]
                continue
            labels[k] = self.labels[int(i)]
            if planned is not _DONE:  # else decoded at a reduced DCT scale into its slot already
                regions.append((k, int(i)) + planned)
        decoded = jpeg_regions.decode_regions([r[2] for r in regions], [r[3] for r in regions], fast=transform.train)
        for (k, i, _, _, flip), crop in zip(regions, decoded):
            if crop is None:  # nvImageCodec did not decode it: one by one, as any other file
                labels[k] = self.sample(i, out=images[k])[1]
            else:
                transform.finish_crop(crop, flip, images[k])
                self.region_decoded += 1
        return AssembledBatch([(images[k], labels[k]) for k in range(len(indices))], [images, labels])

    def _plan_region(self, i: int, out: np.ndarray):
        """For a complete JPEG whose box needs the full-size decode: ``(bytes, region, flip)`` for the batch's
        region decode. A box small enough for a reduced DCT scale is decoded here into ``out`` (``_DONE``).
        None (nothing drawn from the RNGs yet, or a decode failed): :meth:`sample` decodes it. A file marked
        unreadable is planned as any other (what is drawn is a function of the file, not of what was met before)."""
        try:
            with open(self.path(i), "rb") as f:
                data = f.read()
        except OSError:
            return None
        if data[:2] != JPEG_MAGIC or not jpeg_regions.complete(data):
            return None
        planned = self.transform.plan(data, self.max_pixels)
        if planned is None:
            return None
        height, width, box, flip = planned
        if dct_scale(box[2], box[3], self.transform.size) > 1:
            try:
                image, scaled_box = self.transform.decode_scaled(data, height, width, box)
            except ValueError:
                return None
            self.transform._finish(image, scaled_box, flip, out)
            return _DONE
        return data, pixel_region(box, height, width), flip


_DONE = object()  # _plan_region: decoded into its slot already
