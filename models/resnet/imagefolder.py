"""``ImageFolderDataset``: images in one sub-directory per class (the ImageNet
``train/`` and ``val/`` layout), decoded in DataLoader workers by the
transform: a transform with ``from_file(path)`` reads the file itself
(``models.resnet.turbo``: libjpeg-turbo for JPEGs, Pillow for the rest);
any other transform gets the image as decoded by Pillow (:func:`read_rgb`).

    root/n01440764/n01440764_10026.JPEG
    root/n01443537/...

Classes are the sorted sub-directory names (or the ``classes`` given, so that
``val/`` uses the indices of ``train/``). File paths are kept relative, in one
numpy bytes array, so forked workers do not copy a list of a million Python
strings.

Unreadable images (missing, truncated, not an image) never crash or hang a
loader without a name. paddle 3.3's DataLoader cannot carry an exception out
of ``__getitem__``: with workers the main thread sees only "Blocking queue is
killed", and without workers (the reading runs in a loader thread) it waits
forever. So ``__getitem__`` never raises: it marks the file in a flag array in
shared memory (a ``RawArray`` the forked workers inherit; a marked file is not
read again), logs its path once, and returns the next readable image in the
folder (with its label), so batches keep their size. Which image that is, and
what it draws from python's and numpy's RNGs (the crop box and flip), depend
only on the files: a file that fails puts the RNGs back to where they were
before it was tried, so a process that meets it for the first time (a resumed
run) draws as one that marked it long ago, and resume stays exact. An image
whose header says more than ``max_pixels`` pixels, and a 32-bit (``I``, ``F``)
one, is a bad image too (:func:`read_rgb`); 16-bit ones are scaled to 8 bits.
The files are listed by :mod:`models.resnet.folder_listing` (symlinks followed
once per real folder and file). Then, by ``bad_images``:

* ``skip``: training goes on; ``bad_paths()`` lists the marked files (the
  task's ``BadImages`` callback sums them over ranks into results.json).
* ``fail``: the task's ``BadImages`` callback raises :class:`BadImageError`
  naming the file in the main process at the end of the step (or evaluation)
  that met it.

If ``MAX_CONSECUTIVE_BAD`` files in a row cannot be read, the data is broken
rather than damaged: ``broken()`` turns true and the callback stops the run
in either mode.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import warnings
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import paddle

from trainer.data.host_rng import host_rng_state, restore_host_rng_state
from trainer.errors import DataError

from .folder_listing import find_classes, listing_fingerprint, scan_images

logger = logging.getLogger("models.resnet")

BAD_IMAGE_CHOICES = ("skip", "fail")
MAX_CONSECUTIVE_BAD = 64
#: Default ``max_image_pixels``: Pillow's own limit (``PIL.Image.MAX_IMAGE_PIXELS``, ~89.5 Mpx).
MAX_IMAGE_PIXELS = 89_478_485


class BadImageError(DataError):
    """An image file cannot be read. One line, even when re-raised from a worker."""

    def __init__(self, message: str, path: Optional[str] = None, reason: Optional[str] = None):
        marker = f"{type(self).__name__}: "
        if "\n" in message and marker in message:  # paddle's worker re-raise: keep our own line
            message = message.rsplit(marker, 1)[1].strip().splitlines()[0]
        super().__init__(message)
        self.path, self.reason = path, reason


def read_rgb(path, hint: str = "replace or delete the file, or pass --bad_images skip",
             max_pixels: int = MAX_IMAGE_PIXELS):
    """Open and fully decode ``path`` (or a file object) as an RGB PIL image; BadImageError naming the file
    otherwise, also for an image of more than ``max_pixels`` pixels by its header (0: no limit), read before
    anything is decoded. 16-bit images (``I;16`` modes) are scaled to 8 bits; 32-bit integer and float
    images (``I``, ``F``: no fixed range) are refused."""
    from PIL import Image

    _quiet_pillow_bomb_warning(Image)
    try:
        with Image.open(path) as image:
            check_pixels(path, image.width, image.height, max_pixels)
            return to_rgb(image, path)  # decodes the whole file: truncation shows up here
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        if isinstance(exc, BadImageError):
            raise BadImageError(f"{exc}: {hint}", path=exc.path, reason=exc.reason) from None
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadImageError(f"image {path} cannot be read ({reason}): {hint}", path=path, reason=reason) from None


def _quiet_pillow_bomb_warning(Image) -> None:
    """Pillow's DecompressionBombWarning (a second, nameless line for an image over its ~89.5 Mpx) is
    ignored: :func:`check_pixels` names the file against max_image_pixels instead. Set once per process."""
    if not _BOMB_WARNING_QUIET:
        warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
        _BOMB_WARNING_QUIET.append(True)


_BOMB_WARNING_QUIET: list = []


def check_pixels(path, width: int, height: int, max_pixels: int = MAX_IMAGE_PIXELS) -> None:
    """BadImageError (without the hint) when ``width x height`` is over ``max_pixels`` (0: no limit)."""
    if max_pixels and width * height > max_pixels:
        reason = (f"its header says {width}x{height} = {width * height / 1e6:.1f} Mpx, over max_image_pixels "
                  f"{max_pixels} ({max_pixels / 1e6:.1f} Mpx)")
        raise BadImageError(f"image {path} is not read ({reason})", path=str(path), reason=reason)


def to_rgb(image, path):
    """``image`` (any PIL mode) as 8-bit RGB: 16-bit modes scaled (65535 -> 255), others by Pillow's convert."""
    from PIL import Image

    if image.mode.startswith("I;16"):
        wide = np.asarray(image).astype(np.uint32)
        return Image.fromarray(((wide * 255 + 32767) // 65535).astype(np.uint8), mode="L").convert("RGB")
    if image.mode in ("I", "F"):
        reason = f"mode {image.mode}: {'32-bit integer' if image.mode == 'I' else 'floating-point'} pixels have no " \
                 "fixed range; save it with 8 or 16 bits per channel"
        raise BadImageError(f"image {path} cannot be read ({reason})", path=str(path), reason=reason)
    return image.convert("RGB")


class ImageFolderDataset(paddle.io.Dataset):
    """(image, int64 label) pairs from a class-per-folder tree (the ResNet task's transforms give uint8 CHW).

    Args:
        root: the folder (e.g. ``imagenet/train``).
        transform: PIL RGB image -> array (see ``models.resnet.transforms``), or an object
            with ``from_file(path) -> array`` that decodes the file itself (``models.resnet.turbo``).
        classes: class names in label order; default: the sorted sub-folders of ``root``.
        bad_images: ``fail`` or ``skip`` (see the module docstring).
        max_pixels: an image whose header says more pixels is a bad image (skipped or failed as one
            that cannot be read), never decoded; 0: no limit. Default :data:`MAX_IMAGE_PIXELS`.
    """

    def __init__(self, root: str, transform: Callable, classes: Optional[Sequence[str]] = None,
                 bad_images: str = "skip", max_pixels: int = MAX_IMAGE_PIXELS):
        if bad_images not in BAD_IMAGE_CHOICES:
            raise DataError(f"bad_images={bad_images!r} is not allowed: choose skip or fail")
        if int(max_pixels) < 0:
            raise DataError(f"max_image_pixels={max_pixels!r} is not allowed: give a pixel count, or 0 for no limit")
        self.max_pixels = int(max_pixels)
        self.root = os.path.abspath(root)
        self.classes = list(classes) if classes is not None else find_classes(self.root)
        paths, labels = scan_images(self.root, self.classes)
        self.paths = np.array([p.encode("utf-8") for p in paths])  # one bytes array, not a list of str
        self.labels = np.asarray(labels, dtype="int64")
        self.transform = transform
        self.bad_images = bad_images
        self._bad = multiprocessing.RawArray("b", len(paths))  # 1 = unreadable; shared with forked workers
        self._any_bad = multiprocessing.RawValue("b", 0)        # 1 = some file failed: cheap to read every step
        self._broken = multiprocessing.RawValue("b", 0)         # 1 = MAX_CONSECUTIVE_BAD failures in a row
        self._reported: set = set()
        self._fingerprint: Optional[dict] = None

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, i: int) -> str:
        return os.path.join(self.root, self.paths[i].decode("utf-8"))

    def __getitem__(self, i: int):
        return self.sample(i)

    def sample(self, i: int, out: Optional[np.ndarray] = None):
        """``(pixels, label)`` of image ``i``, or of the next readable one (see the module docstring).
        With ``out`` (a transform with ``from_file(path, out=...)``) the pixels are written into it."""
        n = len(self.labels)
        for attempt in range(min(n, MAX_CONSECUTIVE_BAD)):
            j = (int(i) + attempt) % n
            if self._bad[j]:
                continue
            drawn_from = host_rng_state()  # ~2 us; put back below: a file that fails draws nothing
            try:
                pixels = self._load(self.path(j), out)
            except BadImageError as exc:  # never raise here (see the module docstring)
                restore_host_rng_state(drawn_from)
                self._bad[j] = 1
                self._any_bad.value = 1
                if j not in self._reported:
                    self._reported.add(j)
                    logger.warning("unreadable image %s (%s): %s", exc.path, exc.reason,
                                   "using the next image" if self.bad_images == "skip" else "the run stops")
                continue
            return pixels, self.labels[j]
        self._broken.value = 1
        from PIL import Image

        pixels = self.transform(Image.new("RGB", (8, 8)))
        if out is not None:
            out[...] = pixels
            pixels = out
        return pixels, self.labels[int(i)]

    def _load(self, path: str, out: Optional[np.ndarray] = None):
        from_file = getattr(self.transform, "from_file", None)
        if from_file is not None:
            return from_file(path, out=out, max_pixels=self.max_pixels)  # BadImageError if unreadable
        return self.transform(read_rgb(path, max_pixels=self.max_pixels))

    #: What :meth:`fingerprint` covers (said by the resume line, ``trainer.checkpoint.fingerprint.checked``).
    fingerprint_checks = "paths and sizes"

    def data_files(self) -> List[str]:
        """Every image file, in sample order: the Trainer hashes their bytes with ``--data_fingerprint content``."""
        return [self.path(i) for i in range(len(self.paths))]

    def fingerprint(self) -> dict:
        """What a checkpoint records of this folder (the Trainer's data-fingerprint hook, see
        ``docs/how-to/resume.md``): the digest of the sorted relative paths with their sizes, per class
        folder too, and the listing itself for small folders (:func:`~models.resnet.folder_listing.listing_fingerprint`).
        One ``os.stat`` per file, the first time it is asked for (at the first save, or on resume)."""
        if self._fingerprint is None:
            paths = [p.decode("utf-8") for p in self.paths]
            self._fingerprint = listing_fingerprint(self.root, paths, self.labels.tolist(), self.classes)
        return self._fingerprint

    def has_bad(self) -> bool:
        """Whether any file was found unreadable (one shared byte: cheap enough for every step)."""
        return bool(self._any_bad.value)

    def broken(self) -> bool:
        """Whether ``MAX_CONSECUTIVE_BAD`` files in a row could not be read."""
        return bool(self._broken.value)

    def bad_paths(self) -> List[str]:
        """The files found unreadable so far, by this process or its workers."""
        flags = np.frombuffer(self._bad, dtype=np.int8)
        return [self.path(i) for i in np.flatnonzero(flags)]
