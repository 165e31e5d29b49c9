"""The training data's fingerprint: recorded in each checkpoint, compared on resume.

A resumed run computes its position in the epoch (the sampler's index), so it is
exact only over the same samples in the same order. A changed sample count is
refused by :func:`trainer.checkpoint.resume.check_resume`; a change that keeps
the count (one image removed, another added) is what the fingerprint catches.

**The hook.** A training dataset may describe its content with ``fingerprint``:
a method (called on rank 0 at every save and on every rank when a run resumes:
make it cheap, or compute it once and keep it) or an attribute, whose value is a
string (a digest) or a dict of JSON values. A dict may hold mappings (name ->
value, e.g. ``{"files": {"a/x.jpg": 1234}}``): a resume then names the entries
removed, added or changed in the finest mapping that differs. The ImageFolder
datasets of ``models.resnet`` give the digest of their sorted relative paths with
sizes, a digest per class folder and, for small folders, the listing itself. A
dataset without the hook is checked by its length only.

**The files.** A dataset may also name the files its samples are read from with
``data_files`` (a method or an attribute: a sequence of paths). Without a
``fingerprint`` hook, the trainer then records their paths (relative to their
common folder) and sizes itself (:func:`files_fingerprint`: one ``os.stat`` per
file). With ``data_fingerprint="content"`` (``TrainingArguments``, ``--data_fingerprint
content``) it also hashes every file's bytes (:func:`content_fingerprint`: blake2b,
in threads), so a pixel or a line changed at the same size is caught too; the
dataset must then name its files. What a resume checked is said in one line
(:func:`checked`).

On resume a changed fingerprint is a :class:`~trainer.errors.ConfigError` (exit 2)
of one line naming what changed (for contents: the first file that differs);
``resume_allow_data_change=True`` resumes anyway, on purpose (the checkpoints
written from then on record the new fingerprint).

    >>> data_changes({"files": {"a/x.jpg": 10, "a/z.jpg": 5}}, {"files": {"a/y.jpg": 12, "a/z.jpg": 5}})
    'files: 1 removed (a/x.jpg), 1 added (a/y.jpg)'
"""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ..errors import ConfigError, DataError, option

#: The name of the hook (a method or an attribute of the training dataset).
HOOK = "fingerprint"
#: The dataset's files (a method or an attribute giving a sequence of paths): paths and sizes, and contents on demand.
FILES_HOOK = "data_files"
#: What the dataset's own ``fingerprint`` covers, in words (an attribute; for the resume line), e.g. "paths and sizes".
CHECKS_HOOK = "fingerprint_checks"
#: ``TrainingArguments.data_fingerprint``: what is recorded of the files and compared on resume.
MODES = ("sizes", "content")
#: The key of the contents' part of a fingerprint, and the hash it is made with.
CONTENT = "content"
CONTENT_HASH = "blake2b-128"
#: Listings (name -> size or hash) up to this many files; above, a digest per :data:`CHUNK` files in order.
LISTED_FILES = 5000
CHUNK = 1000
_THREADS = 8  # reads and blake2b release the GIL: threads overlap the disk's latency and use the cores
_SHOWN = 3  # entries named per kind of change
_computed = weakref.WeakKeyDictionary()  # dataset -> {mode: the trainer's part of its fingerprint}, once per fit()


def data_fingerprint(dataset, mode: str = "sizes") -> dict | None:
    """The dataset's fingerprint as a JSON-able dict (a string becomes ``{"digest": ...}``): its ``fingerprint``
    hook (a method, or a string or dict attribute), else the paths and sizes of its ``data_files``; with ``mode``
    ``content`` the hashes of those files' bytes under :data:`CONTENT` too. None when it has neither hook.
    DataError (one line) when the method returns anything else, or a dict that is not JSON. What the trainer
    computes (sizes of the files, contents) is computed once per fit() (see :func:`begin_fit`)."""
    value = _own_fingerprint(dataset)
    named = _has(dataset, FILES_HOOK)
    if value is None and named:
        value = _once(dataset, "sizes", lambda: files_fingerprint(data_files(dataset)))
    if mode == "content" and value is not None and named:
        value = dict(value, **{CONTENT: _once(dataset, "content", lambda: content_fingerprint(data_files(dataset)))})
    return value


def begin_fit(dataset, mode: str) -> None:
    """At the start of each ``fit()``, before the resume check: forget what an earlier fit() computed of this
    dataset's files (they may have changed since), and refuse (ConfigError, one line) ``mode`` content for a dataset
    that names no files to hash (a fresh run finds out now, not at its first save)."""
    try:
        _computed.pop(dataset, None)
    except TypeError:
        pass  # not weakly referable: nothing was kept
    if mode == "content" and dataset is not None and data_files(dataset) is None:
        raise ConfigError(f"{option('data_fingerprint', 'content')}: the training dataset ({type(dataset).__name__}) "
                          f"names no files to hash: give it a {FILES_HOOK}() method returning its file paths "
                          f"(docs/how-to/resume.md), or keep {option('data_fingerprint', 'sizes')}")


def data_files(dataset) -> list[str] | None:
    """The paths the dataset's ``data_files`` hook names (a method or a sequence attribute), or None."""
    if not _has(dataset, FILES_HOOK):
        return None
    hook = getattr(dataset, FILES_HOOK)
    paths = hook() if callable(hook) else hook
    return None if paths is None else [os.fspath(p) for p in paths]


def files_fingerprint(paths: Sequence[str]) -> dict:
    """``{"digest", "count", "files"}``: the digest of the files' names (relative to their common folder) with their
    sizes (one ``os.stat`` each; -1 for a file that cannot be read), and the listing name -> size (above
    :data:`LISTED_FILES` files: a digest per :data:`CHUNK` files, keyed by the first and last name)."""
    names = _names_of(paths)
    sizes = [_size(p) for p in paths]
    return {"digest": _digest(names, sizes), "count": len(names), "files": _listing(names, sizes)}


def content_fingerprint(paths: Sequence[str]) -> dict:
    """``{"hash", "digest", "count", "files"}`` of the files' bytes: a blake2b-128 per file (read in threads), the digest of
    names with hashes, and the listing name -> hash (chunked as in :func:`files_fingerprint`)."""
    names = _names_of(paths)
    with ThreadPoolExecutor(min(_THREADS, max(1, len(paths)))) as pool:
        hashes = list(pool.map(_file_hash, paths))
    return {"hash": CONTENT_HASH, "digest": _digest(names, hashes), "count": len(names),
            "files": _listing(names, hashes)}


def _has(dataset, name: str) -> bool:
    """Whether the dataset has the hook ``name``: a method, or an attribute of the hook's kind (a string or a dict
    for ``fingerprint``, a list or tuple of paths for ``data_files``); an attribute of that name that is not ours
    (an array of chemical fingerprints) is not one."""
    hook = getattr(dataset, name, None)
    return hook is not None and (callable(hook) or isinstance(hook, (str, dict) if name == HOOK else (list, tuple)))


def _own_fingerprint(dataset) -> dict | None:
    if not _has(dataset, HOOK):
        return None
    hook = getattr(dataset, HOOK)
    value = hook() if callable(hook) else hook
    if isinstance(value, str):
        value = {"digest": value}
    try:
        if not isinstance(value, dict):
            raise TypeError(f"a {type(value).__name__}")
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise DataError(f"the training dataset's {HOOK}() gave {exc}: return a string or a dict of JSON values "
                        "(docs/how-to/resume.md)") from None
    return value


def data_changes(old: dict, new: dict) -> str | None:
    """What differs between two fingerprints, in one phrase; None when they are equal. Of the mappings that
    differ, the one with the most entries (the finest) is named; without one, the plain values that differ.
    The contents (:data:`CONTENT`) are compared only when both recorded them, and only once the rest is equal:
    then the first file whose bytes differ is named."""
    old_rest = {k: v for k, v in old.items() if k != CONTENT}
    new_rest = {k: v for k, v in new.items() if k != CONTENT}
    what = _changes(old_rest, new_rest)
    if what is None and isinstance(old.get(CONTENT), dict) and isinstance(new.get(CONTENT), dict):
        return _content_changes(old[CONTENT], new[CONTENT])
    return what


def checked(dataset, old: dict, new: dict | None, mode: str, samples) -> str:
    """What a resume compared of the training data and found equal, in one line (said on rank 0)."""
    if new is None:
        if samples is None:
            return "training data: a stream (IterableDataset) without a fingerprint: nothing of it is compared"
        if _has(dataset, HOOK) or _has(dataset, FILES_HOOK):
            return (f"training data: {_count(samples)} samples, as in the checkpoint (it recorded no fingerprint of "
                    f"them to compare; the checkpoints this run writes do)")
        return (f"training data: {_count(samples)} samples, as in the checkpoint (the dataset gives no {HOOK}() or "
                f"{FILES_HOOK}(): only their number is compared, not what they hold)")
    named = _has(dataset, FILES_HOOK)
    what = getattr(dataset, CHECKS_HOOK, None) if _has(dataset, HOOK) else "paths and sizes"
    line = "training data: "
    if named:
        count = (None if _has(dataset, HOOK) else new.get("count")) or (new.get(CONTENT) or {}).get("count") \
            or len(data_files(dataset))
        line += f"{_count(count)} file{'s' if count != 1 else ''}, "
    line += f"{what} match" if what else f"the dataset's {HOOK}() matches"
    if not named:
        return line
    if isinstance(old.get(CONTENT), dict) and isinstance(new.get(CONTENT), dict):
        return f"{line}, and their contents too ({CONTENT_HASH} of every file)"
    if mode == "content":
        return f"{line} (contents not compared: the checkpoint recorded none; the checkpoints this run writes record them)"
    return f"{line} (contents not checked; {option('data_fingerprint', 'content')} checks them)"


def _changes(old: dict, new: dict) -> str | None:
    if old == new:
        return None
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    maps = [k for k in keys if isinstance(old.get(k), dict) and isinstance(new.get(k), dict)]
    if maps:
        key = max(maps, key=lambda k: len(set(old[k]) | set(new[k])))
        return f"{key}: {_mapping_changes(old[key], new[key])}"
    return "; ".join(f"{k} {_short(old.get(k))} then, {_short(new.get(k))} now" for k in keys[:_SHOWN])


def _mapping_changes(old: dict, new: dict) -> str:
    removed = [k for k in old if k not in new]
    added = [k for k in new if k not in old]
    changed = [k for k in old if k in new and old[k] != new[k]]
    parts = []
    for what, names in (("removed", removed), ("added", added)):
        if names:
            parts.append(f"{len(names)} {what} ({_names(names)})")
    if changed:
        shown = ", ".join(f"{k}: {_short(old[k])} -> {_short(new[k])}" for k in changed[:_SHOWN])
        parts.append(f"{len(changed)} changed ({shown}{', ...' if len(changed) > _SHOWN else ''})")
    return ", ".join(parts)


def _names(names) -> str:
    return ", ".join(map(str, names[:_SHOWN])) + (", ..." if len(names) > _SHOWN else "")


def _short(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _content_changes(old: dict, new: dict) -> str | None:
    if old.get("hash") != new.get("hash") or old == new:
        return None  # another hash (written by another version): not comparable
    before, now = old.get("files") or {}, new.get("files") or {}
    differ = [name for name in before if name in now and before[name] != now[name]]
    if not differ:
        return "contents differ"
    if int(old.get("count", 0)) > LISTED_FILES:
        return (f"contents: {len(differ)} of {len(before)} groups of {CHUNK} files differ, the first: the files "
                f"{differ[0]} (a hash per file is recorded for up to {LISTED_FILES:,} files)")
    if len(differ) == 1:
        return f"contents: {differ[0]} differs (1 of {len(before)} files)"
    return f"contents: {len(differ)} of {len(before)} files differ, the first: {differ[0]}"


def _once(dataset, mode: str, compute):
    try:
        done = _computed.setdefault(dataset, {})
    except TypeError:  # not weakly referable or not hashable: computed at each call
        return compute()
    if mode not in done:
        done[mode] = compute()
    return done[mode]


def _names_of(paths: Sequence[str]) -> list[str]:
    """The paths relative to their common folder (a single file: its name), so a moved data folder still matches."""
    if not paths:
        return []
    absolute = [os.path.abspath(p) for p in paths]
    root = os.path.dirname(absolute[0]) if len(absolute) == 1 else os.path.commonpath(absolute)
    if len(absolute) > 1 and root in absolute:  # one path is the common folder itself (a file and a folder)
        root = os.path.dirname(root)
    return [os.path.relpath(p, root) for p in absolute]


def _digest(names: Sequence[str], values: Sequence) -> str:
    whole = hashlib.sha256()
    for name, value in zip(names, values):
        whole.update(f"{name}\0{value}\n".encode("utf-8", "surrogateescape"))
    return whole.hexdigest()[:32]


def _listing(names: Sequence[str], values: Sequence) -> dict:
    if len(names) <= LISTED_FILES:
        return dict(zip(names, values))
    return {f"{names[i]} .. {names[min(i + CHUNK, len(names)) - 1]}": _digest(names[i:i + CHUNK], values[i:i + CHUNK])[:16]
            for i in range(0, len(names), CHUNK)}


def _file_hash(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, lambda: hashlib.blake2b(digest_size=16)).hexdigest()
    except OSError:
        return "unreadable"


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def _count(n) -> str:
    return f"{n:,}" if isinstance(n, int) else str(n)
