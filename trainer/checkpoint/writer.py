"""Writing checkpoints complete-or-nothing.

:func:`write_snapshot` runs on rank 0, in :class:`CheckpointWriter`'s
background thread or inline: it writes into ``.tmp-step-<N>-<pid>``, fsyncs
every file, writes the manifest and then its digest (``manifest.sha256``) last, renames the directory into place, and
only then records the run (``run_id``) and moves the ``latest`` pointer (each
written to a temporary file and ``os.replace``-d). A process that lost its output_dir (a lease taken
over: :mod:`trainer.checkpoint.fence`) writes nothing: the generation is checked before the first file
and again, under the guard, at each rename and pointer move. A failed or killed save leaves the previous checkpoints and
``latest`` untouched; its temporary directory is removed by the next save.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import threading
import time
from typing import Optional, Tuple

import paddle

from ..errors import TrainerError, TrainingError, option
from . import fence
from .host_buffers import HostBuffers
from .lock import holder
from .owner import pid_alive, same_namespace
from .manifest import FORMAT_VERSION, LATEST, read_manifest, sha256_file, write_manifest
from .store import RUN_ID_FILE, note_verified, point_latest, write_run_id
from .tensor_file import save_tensors as write_safetensors  # safetensors' own writer holds the GIL for the whole file


def _fsync_file(path: str) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: str, value) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, sort_keys=True)


class CheckpointWriter:
    """Writes checkpoints in one background thread, one at a time.

    ``submit`` waits for the previous write first, so at most one save is in
    flight. An error in the writer is kept and raised (as TrainingError) by the
    next ``wait`` or ``raise_if_failed``: training stops with it, never silently.
    ``buffers``: the snapshot's host memory (:class:`HostBuffers`), released when each write ends.
    """

    def __init__(self):
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self.buffers = HostBuffers()

    def submit(self, job, background: bool) -> None:
        self.wait()
        if not background:
            try:
                job()
            finally:
                self.buffers.release()
            return
        self._thread = threading.Thread(target=self._run, args=(job,), name="checkpoint-writer", daemon=True)
        self._thread.start()

    def _run(self, job) -> None:
        try:
            job()
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread
            self._error = exc
        finally:
            self.buffers.release()

    def join(self) -> None:
        """Wait for the write in flight, if any; its error is kept for :meth:`wait` (raised there, not here)."""
        if self._thread is not None:
            self._thread.join()

    def close(self) -> None:
        """Wait for the write in flight (raising its error) and give the snapshot's host memory back."""
        try:
            self.wait()
        finally:
            self.buffers.clear()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, TrainerError):  # already names the checkpoint and the file (or the new owner)
                raise error
            raise TrainingError(f"saving a checkpoint failed: {type(error).__name__}: {error}") from error



def write_snapshot(snap: dict, final: str, publish_root: Optional[str]) -> str:
    """Write a snapshot into ``final`` (complete or not at all); then move ``latest``.

    An OSError becomes a TrainingError naming the file (a full disk, a read-only directory).
    """
    owner_dir = owner_dir_of(final)
    try:
        fence.check(owner_dir)  # a run that lost its output_dir writes nothing, not even a temporary
        _write_checkpoint(snap, final, owner_dir)
        note_verified(final)  # every file was just hashed from what was written: rotation need not re-read it
        if publish_root is not None:
            write_run_id(publish_root, snap.get("run_id", ""))  # the run these checkpoints belong to
            _publish_latest(publish_root, os.path.basename(final))
    except OSError as exc:
        raise save_failed(exc, final, owner_dir) from exc
    return final


def owner_dir_of(final: str) -> str:
    """The output_dir a checkpoint ``final`` (``OUTPUT_DIR/checkpoints/step-N``) belongs to: what the fence guards."""
    return os.path.dirname(os.path.dirname(os.path.abspath(final)))


def save_failed(exc: OSError, final: str, owner_dir: str) -> TrainingError:
    """The one line for an OSError while saving ``final``: the file, why, and that the previous checkpoints are kept
    (an output_dir taken over mid-save raises that instead: :func:`fence.check`)."""
    fence.check(owner_dir)  # taken over mid-save (an overwrite moved checkpoints/ away): say that instead
    where = exc.filename or final
    why = "the disk is full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
    return TrainingError(f"saving checkpoint {final} failed: {why} writing {where}; the previous checkpoints are "
                         f"kept: free space or fix the permissions, then resume with "
                         f"{option('resume_from_checkpoint', 'auto')}")


def save_tensors(arrays: dict, target: str) -> Tuple[int, str]:
    """``arrays`` to the safetensors file ``target``; its (bytes, sha256), hashed as written; an OSError naming
    ``target`` when the disk refuses."""
    try:
        return write_safetensors(arrays, target)
    except Exception as exc:  # an OSError without the file's name (os.write), or another library's error
        found = re.search(r"os error (\d+)", str(exc))
        code = getattr(exc, "errno", None) or (int(found[1]) if found else None)
        if not code:
            raise
        raise OSError(code, os.strerror(code), target) from exc


def _write_checkpoint(snap: dict, final: str, owner_dir: str) -> None:
    parent = os.path.dirname(os.path.abspath(final))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".tmp-{os.path.basename(final)}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        hashed = {}  # the tensor files' sha256 comes with their write (tensor_file: no second pass over them)
        for part in ("model", "optimizer"):
            size, digest = save_tensors(snap[part], os.path.join(tmp, f"{part}.safetensors"))
            hashed[f"{part}.safetensors"] = {"bytes": size, "sha256": digest}
        _write_json(os.path.join(tmp, "trainer.json"), snap["meta"])
        files = {}
        for name in sorted(os.listdir(tmp)):
            full = os.path.join(tmp, name)
            _fsync_file(full)
            files[name] = hashed.get(name) or {"bytes": os.path.getsize(full), "sha256": sha256_file(full)}
        write_manifest(tmp, {
            "format_version": FORMAT_VERSION, "step": snap["step"], "time": time.time(), "run_id": snap.get("run_id", ""),
            "versions": {"paddle": paddle.__version__, "format": FORMAT_VERSION}, "files": files})
        move_into_place(tmp, final, owner_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def move_into_place(tmp: str, final: str, owner_dir: str) -> None:
    """Rename the complete temporary directory ``tmp`` (its manifest written last) to ``final``, durably, under the
    fence: only while ``owner_dir`` is still this run's."""
    parent = os.path.dirname(os.path.abspath(final))
    _fsync_dir(tmp)
    old = None
    with fence.fenced(owner_dir):  # still this run's output_dir, and no takeover until renamed
        if os.path.exists(final):  # re-saving the same step: move the old one aside, then replace
            old = os.path.join(parent, f".old-{os.path.basename(final)}-{os.getpid()}")
            os.rename(final, old)
        os.rename(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(parent)


def remove_stale_temporaries(root: str) -> None:
    """Delete ``.tmp-*``/``.old-*``/``.deleting-*`` directories and ``.latest.tmp-*`` files left by a process
    that died mid-save or mid-rotation (rank 0, at the start of fit() and before a save).

    A temporary named for a PID is kept while that PID lives here; and while the output_dir's lock is held,
    under a lease that has not expired, by a holder in another PID namespace or on another host (whose
    writer this process cannot check), no temporary of a PID that is not alive here is touched either.
    """
    if not os.path.isdir(root):
        return
    prefixes = (".tmp-", ".old-", ".deleting-", f".{LATEST}.tmp-", f".{RUN_ID_FILE}.tmp-")
    names = [n for n in os.listdir(root) if n.startswith(prefixes)]
    if not names:
        return
    owner = holder(os.path.dirname(os.path.abspath(root)))
    foreign_live_owner = owner is not None and not same_namespace(owner)
    for name in names:
        pid = name.rsplit("-", 1)[-1]
        if not name.startswith(".deleting-"):
            if pid.isdigit() and (int(pid) == os.getpid() or pid_alive(int(pid))):
                continue  # its writer lives in this PID namespace
            if foreign_live_owner:
                continue  # its writer may be the live holder, elsewhere
        full = os.path.join(root, name)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(full)


def _publish_latest(root: str, name: str) -> None:
    """Move ``latest`` to the checkpoint ``name`` once its manifest reads back and matches its digest."""
    read_manifest(os.path.join(root, name))
    point_latest(root, name)
    _fsync_dir(root)
