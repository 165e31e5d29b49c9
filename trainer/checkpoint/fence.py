"""Fencing: the generation of an output_dir's owner, checked before every write that publishes a file.

Every claim of an output_dir (a lock created or taken over, :mod:`trainer.checkpoint.lock`) takes the next
*generation* (a fencing token): ``output_dir/.ptrain.generation`` holds the last one taken (written whole and
fsynced, never lowered), and the owner record carries it as ``"generation"``. A process that holds or shares
the lock holds its generation here (:func:`hold`); before every rename into ``checkpoints/``, every move of
``latest``, every rotation and every write of ``results.json``, ``metrics.jsonl`` and the PaddleNLP-style
``*_results.json`` / ``trainer_state.json`` it enters :func:`fenced` (``callbacks.Export`` and
``save_model()`` call :func:`check` before they start: the deploy room knows nothing of owners):

- under the same ``flock`` on output_dir that taking the lock over holds (on one host no takeover can slip
  between the check and the write),
- it reads the generation file and the owner record; when either names another generation, the lease was
  taken over (this process was paused past its lease, or its clock or its heartbeat failed it): it raises
  :class:`~trainer.errors.OwnershipLost` (exit 7) naming the new owner, and every later write of this process
  into that output_dir is refused without looking again.

A path outside a held output_dir (``save_checkpoint(path)`` elsewhere, a script without a claim) is not
fenced. Where ``flock`` does not work (some network filesystems) the check still runs, without the guard.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from typing import Iterator, Optional

from ..errors import ConfigError, OwnershipLost

__all__ = ["GENERATION_FILE", "LOCK_NAME", "guard", "read_generation", "next_generation", "commit_generation",
           "hold", "drop", "mark_lost", "fenced", "check", "read_record"]

LOCK_NAME = ".ptrain.lock"
GENERATION_FILE = ".ptrain.generation"

_HELD: dict = {}        # abspath(output_dir) -> [generation, ...] (the lock of the command and fit()'s share)
_LOST: dict = {}        # abspath(output_dir) -> the one line that says who owns it now
_STATE = threading.Lock()
_LOCAL = threading.local()  # the guards this thread holds (re-entered, not flock'd twice)


# ---- the guard -----------------------------------------------------------------------------------------
@contextlib.contextmanager
def guard(output_dir: str) -> Iterator[None]:
    """``flock`` on output_dir: racers on this host take turns (best effort where flock is unsupported).
    Re-entrant within a thread."""
    key = os.path.abspath(output_dir)
    held = getattr(_LOCAL, "held", None)
    if held is None:
        held = _LOCAL.held = set()
    if key in held:
        yield
        return
    try:
        fd = os.open(output_dir, os.O_RDONLY)
    except OSError:
        yield
        return
    _GUARD_FDS.add(fd)
    held.add(key)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # e.g. some network filesystems: the link-based creation of the lock is still atomic
        yield
    finally:
        held.discard(key)
        _GUARD_FDS.discard(fd)
        os.close(fd)  # closing releases the flock


# A process forked while a thread holds the guard (a DataLoader worker) would keep a copy of the flock'd
# descriptor, and so the flock, for its whole life: the child closes its copies at once.
_GUARD_FDS: set = set()


def _close_guards_in_child() -> None:
    for fd in list(_GUARD_FDS):
        with contextlib.suppress(OSError):
            os.close(fd)
    _GUARD_FDS.clear()
    _LOCAL.held = set()


os.register_at_fork(after_in_child=_close_guards_in_child)


# ---- the generation file -------------------------------------------------------------------------------
def read_generation(output_dir: str) -> int:
    """The last generation taken in output_dir (0 when none was)."""
    try:
        with open(os.path.join(output_dir, GENERATION_FILE), "rb") as f:
            text = f.read(64).decode("ascii", errors="replace").strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def next_generation(output_dir: str, previous: Optional[dict] = None) -> int:
    """The generation a new claim takes: one above the file's and the replaced record's (under the guard)."""
    last = _generation_of(previous) or 0
    return max(read_generation(output_dir), last) + 1


def commit_generation(output_dir: str, generation: int) -> None:
    """Record ``generation`` as taken (after the lock is ours): a fsynced temporary, then replace."""
    path = os.path.join(output_dir, GENERATION_FILE)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="ascii") as f:
            f.write(f"{generation}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise ConfigError(f"output_dir {output_dir} cannot be written ({path}: {exc.strerror}): choose a "
                          "writable output_dir") from None


def _generation_of(record: Optional[dict]) -> Optional[int]:
    value = (record or {}).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ---- held generations ----------------------------------------------------------------------------------
def hold(output_dir: str, record: dict) -> Optional[int]:
    """This process writes into output_dir as the owner ``record`` names (held or shared); returns its
    generation (None for a record of an older version, which is not fenced)."""
    generation = _generation_of(record)
    if generation is not None:
        with _STATE:
            _HELD.setdefault(os.path.abspath(output_dir), []).append(generation)
    return generation


def drop(output_dir: str, generation: Optional[int]) -> None:
    """Undo one :func:`hold` (the lock released)."""
    if generation is None:
        return
    key = os.path.abspath(output_dir)
    with _STATE:
        held = _HELD.get(key, [])
        if generation in held:
            held.remove(generation)
        if not held:
            _HELD.pop(key, None)
            _LOST.pop(key, None)


def mark_lost(output_dir: str, why: str) -> None:
    """The heartbeat found the lock no longer ours: every later fenced write here is refused with ``why``."""
    key = os.path.abspath(output_dir)
    with _STATE:
        if key in _HELD:
            _LOST.setdefault(key, why)


def lost_line(output_dir: str, mine: int, record: Optional[dict], generation: int) -> str:
    """The one line of a run that lost output_dir: who holds it now, and what this run does."""
    if record is not None and record.get("pid") is not None:
        now = f"process {record.get('pid')} on host {record.get('host')} (job {str(record.get('job', '?'))})"
    else:
        now = "another run"
    return (f"output_dir {output_dir} is no longer this run's: {now} took it over (generation {generation}; this "
            f"run held {mine}, and its lease lapsed, e.g. while it was paused): this run stops without writing "
            "anything more there")


@contextlib.contextmanager
def fenced(output_dir: str) -> Iterator[None]:
    """Run the block (a write into output_dir) only while this process's generation is still the owner's.

    Raises :class:`OwnershipLost` instead; a no-op for an output_dir this process holds no generation of.
    """
    key = os.path.abspath(output_dir)
    with _STATE:
        held = list(_HELD.get(key, ()))
        lost = _LOST.get(key)
    if not held:
        yield
        return
    if lost is not None:
        raise OwnershipLost(lost)
    mine = held[-1]
    with guard(output_dir):
        record = read_record(output_dir)
        current = max(read_generation(output_dir), _generation_of(record) or 0)
        if current != mine or (record is not None and _generation_of(record) != mine):
            line = lost_line(output_dir, mine, record, current)
            with _STATE:
                _LOST.setdefault(key, line)
            raise OwnershipLost(line)
        yield


def check(output_dir: str) -> None:
    """Raise :class:`OwnershipLost` unless this process may still write into output_dir (see :func:`fenced`)."""
    with fenced(output_dir):
        pass


def read_record(output_dir: str) -> Optional[dict]:
    """The owner record in output_dir's lock, or None (no lock, or not a JSON object)."""
    try:
        with open(os.path.join(output_dir, LOCK_NAME), encoding="utf-8") as f:
            record = json.loads(f.read(65536))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
