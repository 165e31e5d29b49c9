"""The file listing of an ImageFolder tree: classes, image files (symlinks followed once), and its fingerprint.

:func:`scan_images` walks ``root/<class>/`` recursively in sorted order. Symlinks
are followed, each real directory and each real file at most once:

* a symlinked directory that leads back to one of its own ancestors (``a/loop -> .``,
  ``a/loop -> ..``) is a loop; one that leads into another class's folder would
  give that class's images a second label; one whose directory was walked already
  would count its images twice. Each is named in one warning line and skipped;
* a file reached twice (a symlink or hard link to an image listed already) is
  counted once: under its real, non-link path when it has one, else the first
  path in sorted order (one warning line gives the number and an example).

:func:`listing_fingerprint` is what a checkpoint records of the training folder
(``ImageFolderDataset.fingerprint``, see ``docs/how-to/resume.md``): the digest
of the sorted relative paths with their sizes, a digest per class folder, and
for folders of at most :data:`LISTED_FILES` images the listing itself, so that a
resume can name the files removed, added or resized.

    >>> listing_fingerprint("/nonexistent", [], [])["files"]
    {}
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Dict, List, Sequence, Tuple

from trainer.errors import DataError

logger = logging.getLogger("models.resnet")

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: Folders of at most this many images record their listing (names and sizes) in each checkpoint.
LISTED_FILES = 5000


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
    """Relative paths and labels of every image file under ``root/<class>/`` (recursive, sorted; symlinks
    followed once per real directory and file, see the module docstring)."""
    index = {c: i for i, c in enumerate(classes)}
    present = find_classes(root)
    unknown = [c for c in present if c not in index]
    if unknown:
        raise DataError(f"{root} has class folder(s) {unknown[:3]} that the training folder does not have: "
                        "train/ and val/ must use the same class names")
    class_dirs = {os.path.realpath(os.path.join(root, name)): name for name in present}
    seen_dirs: set = set()
    found: List[Tuple[str, int, object, bool]] = []  # (relative path, label, real file key, reached through a link)
    for name in present:
        _walk(root, name, index[name], class_dirs, seen_dirs, found)
    paths, labels = _once_per_file(found)
    if not paths:
        raise DataError(f"image folder {root} holds no image files ({', '.join(IMG_EXTENSIONS)})")
    return paths, labels


def _walk(root: str, name: str, label: int, class_dirs: Dict[str, str], seen_dirs: set, found: list) -> None:
    """Append the images under ``root/name`` to ``found`` in os.walk's top-down sorted order."""
    top = os.path.join(root, name)
    stack = [(top, os.path.realpath(top), False, False, (os.path.realpath(root),))]
    while stack:
        path, real, is_link, linked, chain = stack.pop()
        chain = chain + (real,)  # the real folders this one is in, and itself: a link back to one is a loop
        try:
            st = os.stat(path)
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError:
            continue
        if is_link and (st.st_dev, st.st_ino) in seen_dirs:
            logger.warning("symlink %s -> %s leads to a folder read already (its images would count twice): skipped",
                           os.path.relpath(path, root), os.readlink(path))
            continue
        seen_dirs.add((st.st_dev, st.st_ino))
        subdirs = []
        for entry in entries:
            is_link = entry.is_symlink()
            if entry.is_dir():  # follows a link
                target = os.path.realpath(entry.path) if is_link else os.path.join(real, entry.name)
                why = _skip_link(target, chain, class_dirs, name) if is_link else None
                if why:
                    logger.warning("symlink %s -> %s %s: skipped", os.path.relpath(entry.path, root),
                                   os.readlink(entry.path), why)
                else:
                    subdirs.append((entry.path, target, is_link, linked or is_link, chain))
            elif entry.name.lower().endswith(IMG_EXTENSIONS):
                key = _file_key(entry, st.st_dev, is_link)
                found.append((os.path.relpath(entry.path, root), label, key, linked or is_link))
        stack.extend(reversed(subdirs))


def _skip_link(target: str, chain: Tuple[str, ...], class_dirs: Dict[str, str], name: str):
    """Why a symlinked directory (real path ``target``, met inside the real folders ``chain`` while walking
    class ``name``) is not followed, or None."""
    if target in chain or _inside(chain[-1], target):
        return "is a loop (it leads back to a folder it is in)"
    for folder, other in class_dirs.items():
        if other != name and _inside(target, folder):
            return f"leads into class folder {other} (its images would get a second label)"
    return None


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _file_key(entry: os.DirEntry, dev: int, is_link: bool):
    """(device, inode) of the real file; None when it cannot be read (the loader then names it)."""
    try:
        if is_link:
            st = entry.stat()  # follows the link
            return st.st_dev, st.st_ino
        return dev, entry.inode()  # no system call: a file on the directory's device
    except OSError:
        return None


def _once_per_file(found: list) -> Tuple[List[str], List[int]]:
    """Each real file once: under its first path that is not reached through a link, else its first path."""
    chosen: Dict[object, int] = {}
    for k, (_, _, key, linked) in enumerate(found):
        if key is None:
            continue
        first = chosen.get(key)
        if first is None or (found[first][3] and not linked):
            chosen[key] = k
    keep = [k for k, item in enumerate(found) if item[2] is None or chosen[item[2]] == k]
    if len(keep) < len(found):
        dropped = next(k for k, item in enumerate(found) if item[2] is not None and chosen[item[2]] != k)
        logger.warning("%d image file(s) are reached twice (through symlinks or hard links): each counted once, "
                       "e.g. %s is %s", len(found) - len(keep), found[dropped][0], found[chosen[found[dropped][2]]][0])
    return [found[k][0] for k in keep], [found[k][1] for k in keep]


def listing_fingerprint(root: str, paths: Sequence[str], labels: Sequence[int],
                        class_names: Sequence[str] = ()) -> dict:
    """``{"digest", "class folders", "files"}`` of the images ``paths`` (relative to ``root``) with their sizes
    (one ``os.stat`` each, ~5 microseconds of CPU on a local disk; -1 for a file that cannot be read; threads
    were tried: they cost 6x the CPU in GIL hand-overs). ``files`` (path -> size) only up to
    :data:`LISTED_FILES` images, else ``{}``."""
    sizes = [_size(os.path.join(root, rel)) for rel in paths]
    whole = hashlib.sha256()
    groups: Dict[str, "hashlib._Hash"] = {}
    counts: Dict[str, int] = {}
    for rel, label, size in zip(paths, labels, sizes):
        line = f"{rel}\0{size}\n".encode("utf-8", "surrogateescape")
        whole.update(line)
        group = class_names[label] if label < len(class_names) else rel.split(os.sep, 1)[0]
        groups.setdefault(group, hashlib.sha256()).update(line)
        counts[group] = counts.get(group, 0) + 1
    files = dict(zip(paths, sizes)) if len(paths) <= LISTED_FILES else {}
    return {"digest": whole.hexdigest()[:32],
            "class folders": {g: f"{counts[g]} files, {h.hexdigest()[:16]}" for g, h in sorted(groups.items())},
            "files": files}


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1
