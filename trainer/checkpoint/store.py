"""The directory of checkpoints: listing the ``step-N`` checkpoints, the run they belong to, and choosing
the one to resume.

Which run a checkpoints/ folder belongs to: ``checkpoints/run_id`` (one line, written with ``latest`` by
every save, :func:`write_run_id`) names it; folders written before it existed fall back to the run of the
checkpoint ``latest`` names, else of the newest verified one. ``auto`` resumes only that run's checkpoints and
rotation only counts them: a checkpoint copied in from another run is never resumed or deleted.

Order: "newest" is the order the checkpoints were saved in (the manifest's ``time``), not their step
number: after a resume from an earlier step, the new step-15 is newer than the abandoned step-20.

A checkpoint met by ``auto`` whose files do not match its manifest (or that has none) is set aside: renamed
to ``step-N.damaged`` (reported, never deleted, never counted), and ``latest`` is moved to the one resumed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from typing import Callable, Optional, Tuple

from .. import ranks
from ..errors import ConfigError, DataError
from . import fence
from .manifest import (LATEST, MANIFEST, MANIFEST_DIGEST, UnsupportedFormat, VerifiedCheckpoint, checkpoint_run_id,
                       checkpoints_dir, read_verified, verify)

logger = logging.getLogger("trainer.checkpoint")
RUN_ID_FILE = "run_id"   # checkpoints/run_id: the run these checkpoints belong to
DAMAGED = ".damaged"     # step-N.damaged: set aside by auto, kept for a person to look at


def list_checkpoints(output_dir: str, run_id: Optional[str] = None) -> list:
    """``step-N`` directories under output_dir/checkpoints, highest step first.

    With ``run_id``, only the checkpoints whose manifest records that run (see
    :func:`checkpoint_run_id`): rotation and ``auto`` never see another run's.
    """
    root = checkpoints_dir(output_dir)
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        if name.startswith("step-") and name[5:].isdigit() and os.path.isdir(os.path.join(root, name)):
            found.append((int(name[5:]), os.path.join(root, name)))
    paths = [p for _, p in sorted(found, reverse=True)]
    if run_id is not None:
        paths = [p for p in paths if checkpoint_run_id(p) == run_id]
    return paths


def saved_time(path: str) -> float:
    """When the checkpoint was saved (its manifest's ``time``); -inf when the manifest cannot tell."""
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            value = json.load(f).get("time")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("-inf")
    except (OSError, ValueError, AttributeError, UnicodeDecodeError):
        return float("-inf")


def newest_saved_first(paths: list) -> list:
    """``paths`` in the order they were saved, newest first (the step number breaks ties)."""
    return sorted(paths, key=lambda p: (saved_time(p), int(os.path.basename(p)[5:])), reverse=True)


# ---- verified checkpoints (rotation checks each once per process) ---------------------------------
_VERIFIED: dict = {}
_VERIFIED_LOCK = threading.Lock()


def _identity(path: str):
    """The manifest and its digest file as they are now (a verdict is kept per identity)."""
    try:
        st = os.stat(os.path.join(path, MANIFEST))
    except OSError:
        return None
    try:
        seal = os.stat(os.path.join(path, MANIFEST_DIGEST))
        sealed = (seal.st_ino, seal.st_mtime_ns, seal.st_size)
    except OSError:
        sealed = None
    return (os.path.abspath(path), st.st_ino, st.st_mtime_ns, st.st_size, sealed)


def note_verified(path: str) -> None:
    """The writer has just hashed every file of ``path`` it wrote: rotation need not read them again."""
    key = _identity(path)
    if key is not None:
        with _VERIFIED_LOCK:
            _VERIFIED[key] = True


def verifies(path: str) -> bool:
    """Whether ``path``'s files match its manifest (checked once per process per manifest)."""
    key = _identity(path)
    if key is None:
        return False
    with _VERIFIED_LOCK:
        if key in _VERIFIED:
            return _VERIFIED[key]
    try:
        verify(path)
        ok = True
    except DataError:
        ok = False
    with _VERIFIED_LOCK:
        _VERIFIED[key] = ok
    return ok


# ---- the run of a checkpoints/ folder ----------------------------------------------------------------
def read_run_id(output_dir: str) -> Optional[str]:
    """The run ``checkpoints/run_id`` names; None when there is no such file (older folders)."""
    try:
        with open(os.path.join(checkpoints_dir(output_dir), RUN_ID_FILE), "rb") as f:
            text = f.read(256).decode("utf-8", errors="replace").strip()
    except OSError:
        return None
    return text or None


def write_run_id(root: str, run_id: str) -> None:
    """Record ``run_id`` as the run of ``root`` (a checkpoints/ folder): temporary file, then replace."""
    if not run_id:
        return
    path = os.path.join(root, RUN_ID_FILE)
    with contextlib.suppress(OSError):
        with open(path, encoding="utf-8") as f:
            if f.read().strip() == run_id:
                return
    _replace_line(root, RUN_ID_FILE, run_id)


def read_latest(output_dir: str) -> Optional[str]:
    """The checkpoint ``checkpoints/latest`` names (a path, which may not exist), or None."""
    pointer = os.path.join(checkpoints_dir(output_dir), LATEST)
    try:
        with open(pointer, "rb") as f:
            text = f.read(4096).decode("utf-8", errors="replace").strip()
    except OSError:
        return None
    return os.path.join(checkpoints_dir(output_dir), os.path.basename(text)) if text else None


def current_run(output_dir: str, candidates: Optional[list] = None) -> Optional[str]:
    """The run the checkpoints of output_dir belong to: ``checkpoints/run_id``, else the run of the checkpoint
    ``latest`` names, else of the newest saved checkpoint that records one; None when nothing tells."""
    recorded = read_run_id(output_dir)
    if recorded is not None:
        return recorded
    named = read_latest(output_dir)
    if named is not None and checkpoint_run_id(named) is not None:
        return checkpoint_run_id(named)
    for path in newest_saved_first(candidates if candidates is not None else list_checkpoints(output_dir)):
        run = checkpoint_run_id(path)
        if run is not None:
            return run
    return None


def set_aside(path: str, why: str) -> Optional[str]:
    """Rename a damaged checkpoint to ``step-N.damaged`` (``.damaged-2``, ... if taken); return the new path."""
    target, n = path + DAMAGED, 1
    while os.path.exists(target):
        n += 1
        target = f"{path}{DAMAGED}-{n}"
    try:
        with fence.fenced(os.path.dirname(os.path.dirname(os.path.abspath(path)))):
            os.rename(path, target)
    except OSError as exc:
        logger.warning("resume auto: %s is damaged (%s) and cannot be set aside (%s)", path, why, exc.strerror)
        return None
    logger.warning("resume auto: set aside damaged checkpoint %s as %s (%s); it is kept, not resumed, not counted",
                   os.path.basename(path), os.path.basename(target), why)
    return target


def point_latest(root: str, name: str) -> None:
    """Move ``checkpoints/latest`` to ``name`` (temporary file, then replace)."""
    _replace_line(root, LATEST, name)


def _replace_line(root: str, name: str, line: str) -> None:
    """Write ``root/name`` as the one line ``line``, whole or not at all: a fsynced ``.NAME.tmp-PID``, then
    ``os.replace`` (a killed write leaves the temporary, which ``remove_stale_temporaries`` deletes)."""
    tmp = os.path.join(root, f".{name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        with fence.fenced(os.path.dirname(os.path.abspath(root))):  # only while output_dir is still this run's
            os.replace(tmp, os.path.join(root, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def resolve(path: str, output_dir: str, set_aside_damaged: bool = True) -> Optional[str]:
    """The path of the checkpoint to resume from (:func:`resolve_read` without keeping what was read)."""
    found = _resolve(path, output_dir, verify, set_aside_damaged)
    return found if found is None else found[0]


def resolve_read(path: str, output_dir: str, set_aside_damaged: bool = True) -> Optional[VerifiedCheckpoint]:
    """The checkpoint to resume from, read and verified once (the candidate's files are read while they
    are hashed), or None; what resume checks and load applies without reading it again."""
    found = _resolve(path, output_dir, read_verified, set_aside_damaged)
    return found if found is None else found[1]


def _resolve(path: str, output_dir: str, check: Callable[[str], object], set_aside_damaged: bool = True):
    """The checkpoint to resume from, as (path, what ``check`` returned for it), or None.

    ``auto``: the newest saved checkpoint of output_dir's run (:func:`current_run`) whose files verify;
    ``latest`` only breaks ties, it never brings in another run's checkpoint. Another run's checkpoints
    are skipped with a warning naming them; damaged ones are set aside (rank 0, unless
    ``set_aside_damaged`` is False, as for ``ptrain inspect``); a checkpoint in a format this version does
    not read is skipped and left as it is. None when there is none (start fresh). An explicit path must
    exist and verify, else a clear error.
    """
    if path != "auto":
        if not os.path.isdir(path):
            raise ConfigError(f"resume_from_checkpoint={path!r} does not exist: give a checkpoint directory or 'auto'")
        return path, check(path)
    root = checkpoints_dir(output_dir)
    candidates = list_checkpoints(output_dir)
    named = read_latest(output_dir)
    main = ranks.is_main_process()
    if named is not None and named not in candidates and main:
        logger.warning("checkpoints/latest names %s, which does not exist; looking for others", named)
    run = current_run(output_dir, candidates)
    # newest saved first; latest first among checkpoints saved at the same moment (it never brings in another run)
    ordered = sorted(candidates, key=lambda p: (saved_time(p), p == named, int(os.path.basename(p)[5:])), reverse=True)
    skipped, foreign = [], []
    for candidate in [c for c in ordered if saved_time(c) == float("-inf")]:  # no readable manifest: damaged
        try:
            verify(candidate)
            continue  # a readable manifest without a time (an older writer): verified below like any other
        except UnsupportedFormat:
            continue
        except DataError as exc:
            skipped.append(f"{os.path.basename(candidate)} ({exc})")
            ordered.remove(candidate)
            if main and set_aside_damaged:
                set_aside(candidate, str(exc))
    for candidate in ordered:
        owner = checkpoint_run_id(candidate)
        if run is not None and owner is not None and owner != run:
            foreign.append(f"{os.path.basename(candidate)} (run {owner or '(none)'})")
            continue
        try:
            checked = check(candidate)
        except UnsupportedFormat as exc:
            skipped.append(f"{os.path.basename(candidate)} ({exc})")
            continue
        except DataError as exc:
            skipped.append(f"{os.path.basename(candidate)} ({exc})")
            if main and set_aside_damaged:
                set_aside(candidate, str(exc))
            continue
        if main:
            if foreign:
                logger.warning("resume auto: not resuming %d checkpoint(s) of another run than this output_dir's "
                               "(run %s): %s", len(foreign), run, "; ".join(foreign))
            why = "the newest checkpoint whose files verify" + (
                ", named by checkpoints/latest" if candidate == named else "")
            if skipped:
                logger.warning("resume auto: resuming from %s (%s); skipped %d newer: %s", candidate, why,
                               len(skipped), "; ".join(skipped))
            else:
                logger.info("resume auto: resuming from %s (%s)", candidate, why)
            if set_aside_damaged and candidate != named:
                with contextlib.suppress(OSError):
                    point_latest(root, os.path.basename(candidate))  # never leave latest naming a damaged one
        return candidate, checked
    if main and (skipped or foreign):
        logger.warning("resume auto: no checkpoint of this run verifies, starting fresh; skipped: %s",
                       "; ".join(skipped + [f + ": another run" for f in foreign]))
    return None


def on_disk(output_dir: str, step: int) -> Tuple[bool, str]:
    """After a stop at ``step``: (whether a resume has a checkpoint, what a person reads about it)."""
    root = checkpoints_dir(output_dir)
    final = os.path.join(root, f"step-{step}")
    if os.path.isdir(final) and verifies(final):
        return True, f"checkpoint {final} of step {step} is saved and verifies"
    run = current_run(output_dir)
    for path in newest_saved_first(list_checkpoints(output_dir)):
        if (run is None or checkpoint_run_id(path) == run) and verifies(path):
            return True, f"no checkpoint of step {step} was saved; the newest that verifies is {path}"
    return False, f"no checkpoint of step {step} was saved and none is on disk in {root}"
