"""The directory of checkpoints: listing the ``step-N`` checkpoints, and choosing the one to resume."""

from __future__ import annotations

import logging
import os
from typing import Callable, Optional

from .. import distributed as dist
from ..errors import ConfigError, DataError
from .manifest import LATEST, VerifiedCheckpoint, checkpoint_run_id, checkpoints_dir, read_verified, verify

logger = logging.getLogger("trainer.checkpoint")


def list_checkpoints(output_dir: str, run_id: Optional[str] = None) -> list:
    """``step-N`` directories under output_dir/checkpoints, newest first.

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



def resolve(path: str, output_dir: str) -> Optional[str]:
    """The path of the checkpoint to resume from (:func:`resolve_read` without keeping what was read)."""
    found = _resolve(path, output_dir, verify)
    return found if found is None else found[0]


def resolve_read(path: str, output_dir: str) -> Optional[VerifiedCheckpoint]:
    """The checkpoint to resume from, read and verified once (the candidate's files are read while they
    are hashed), or None; what resume checks and load applies without reading it again."""
    found = _resolve(path, output_dir, read_verified)
    return found if found is None else found[1]


def _resolve(path: str, output_dir: str, check: Callable[[str], object]):
    """The checkpoint to resume from, as (path, what ``check`` returned for it).

    ``auto``: the newest checkpoint in output_dir whose manifest verifies (the
    one ``latest`` names first); partial or corrupt ones are skipped with a
    warning naming them and why; None when there is none (start fresh). Only
    checkpoints of the run that ``latest`` names (else of the newest checkpoint)
    are candidates, never another run's. An explicit path must exist and
    verify, else a clear error.
    """
    if path != "auto":
        if not os.path.isdir(path):
            raise ConfigError(f"resume_from_checkpoint={path!r} does not exist: give a checkpoint directory or 'auto'")
        return path, check(path)
    candidates = list_checkpoints(output_dir)
    pointer = os.path.join(checkpoints_dir(output_dir), LATEST)
    named_ok = None
    if os.path.isfile(pointer):
        with open(pointer, "rb") as f:
            text = f.read(4096).decode("utf-8", errors="replace").strip()
        named = os.path.join(checkpoints_dir(output_dir), os.path.basename(text))
        if named in candidates:
            candidates.remove(named)
            candidates.insert(0, named)
            named_ok = named
        elif dist.is_main_process():
            logger.warning("checkpoints/latest names %s, which does not exist; looking for others", named)
    runs = [r for r in (checkpoint_run_id(c) for c in candidates) if r is not None]
    if runs:  # the current run: the one latest names, else the newest checkpoint's
        candidates = [c for c in candidates if checkpoint_run_id(c) in (runs[0], None)]
    skipped = []
    for candidate in candidates:
        try:
            checked = check(candidate)
        except DataError as exc:
            skipped.append(f"{os.path.basename(candidate)} ({exc})")
            continue
        if dist.is_main_process():
            why = "the newest checkpoint whose files verify" + (", named by checkpoints/latest" if candidate == named_ok else "")
            if skipped:
                logger.warning("resume auto: resuming from %s (%s); skipped %d newer: %s", candidate, why,
                               len(skipped), "; ".join(skipped))
            else:
                logger.info("resume auto: resuming from %s (%s)", candidate, why)
        return candidate, checked
    if dist.is_main_process() and skipped:
        logger.warning("resume auto: no checkpoint verifies, starting fresh; skipped: %s", "; ".join(skipped))
    return None


