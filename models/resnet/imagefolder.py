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
folder (with its label), so batches keep their size. Then, by ``bad_images``:

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
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import paddle

from trainer.errors import DataError

logger = logging.getLogger("models.resnet")

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
BAD_IMAGE_CHOICES = ("skip", "fail")
MAX_CONSECUTIVE_BAD = 64


class BadImageError(DataError):
    """An image file cannot be read. One line, even when re-raised from a worker."""

    def __init__(self, message: str, path: Optional[str] = None, reason: Optional[str] = None):
        marker = f"{type(self).__name__}: "
        if "\n" in message and marker in message:  # paddle's worker re-raise: keep our own line
            message = message.rsplit(marker, 1)[1].strip().splitlines()[0]
        super().__init__(message)
        self.path, self.reason = path, reason


def find_classes(root: str) -> List[str]:
    """Sorted names of the sub-directories of ``root``."""
    if not os.path.isdir(root):
        raise DataError(f"image folder {root} does not exist: give --data_dir DIR with train/ and val/ "
                        "holding one sub-directory per class")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if not classes:
        raise DataError(f"image folder {root} has no class sub-directories: put the images of class C in {root}/C/")
    return classes


def scan_images(root: str, classes: Sequence[str]) -> Tuple[List[str], List[int]]:
    """Relative paths and labels of every image file under ``root/<class>/`` (recursive, sorted)."""
    index = {c: i for i, c in enumerate(classes)}
    present = find_classes(root)
    unknown = [c for c in present if c not in index]
    if unknown:
        raise DataError(f"{root} has class folder(s) {unknown[:3]} that the training folder does not have: "
                        "train/ and val/ must use the same class names")
    paths, labels = [], []
    for name in present:
        base = os.path.join(root, name)
        for dirpath, dirnames, filenames in os.walk(base, followlinks=True):
            dirnames.sort()
            for filename in sorted(filenames):
                if filename.lower().endswith(IMG_EXTENSIONS):
                    paths.append(os.path.relpath(os.path.join(dirpath, filename), root))
                    labels.append(index[name])
    if not paths:
        raise DataError(f"image folder {root} holds no image files ({', '.join(IMG_EXTENSIONS)})")
    return paths, labels


def read_rgb(path: str, hint: str = "replace or delete the file, or pass --bad_images skip"):
    """Open and fully decode ``path`` as an RGB PIL image; BadImageError naming the file otherwise."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return image.convert("RGB")  # decodes the whole file: truncation shows up here
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadImageError(f"image {path} cannot be read ({reason}): {hint}", path=path, reason=reason) from None


class ImageFolderDataset(paddle.io.Dataset):
    """(image, int64 label) pairs from a class-per-folder tree (the ResNet task's transforms give uint8 CHW).

    Args:
        root: the folder (e.g. ``imagenet/train``).
        transform: PIL RGB image -> array (see ``models.resnet.transforms``), or an object
            with ``from_file(path) -> array`` that decodes the file itself (``models.resnet.turbo``).
        classes: class names in label order; default: the sorted sub-folders of ``root``.
        bad_images: ``fail`` or ``skip`` (see the module docstring).
    """

    def __init__(self, root: str, transform: Callable, classes: Optional[Sequence[str]] = None,
                 bad_images: str = "skip"):
        if bad_images not in BAD_IMAGE_CHOICES:
            raise DataError(f"bad_images={bad_images!r} is not allowed: choose skip or fail")
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
            try:
                pixels = self._load(self.path(j), out)
            except BadImageError as exc:  # never raise here (see the module docstring)
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
            return from_file(path) if out is None else from_file(path, out=out)  # BadImageError if unreadable
        return self.transform(read_rgb(path))

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
