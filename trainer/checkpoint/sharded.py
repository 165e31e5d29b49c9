"""Writing a sharded checkpoint: every rank its own shard at the same time; rank 0 the manifest once all verify.

:func:`write` takes what :func:`~trainer.checkpoint.snapshot.snapshot` returned on this rank. A snapshot of
ranks that all hold the same state goes to :func:`~trainer.checkpoint.writer.write_snapshot` (rank 0 alone,
format 1). A sharded one (format 2, ``trainer.checkpoint.shards``):

1. every rank writes its ``shard-RRRRR-of-WWWWW.safetensors`` into the checkpoint's temporary directory
   ``.tmp-step-N-<pid of rank 0>`` (one directory that every rank sees: a run over several machines keeps
   its output_dir on a shared filesystem), fsyncs it, hashes what it wrote, and leaves a record
   ``.rank-R.json`` (file, bytes, sha256, the save's token), renamed into place; a rank whose write fails
   leaves ``.rank-R.failed`` with the reason instead;
2. rank 0 waits for every rank's record. The ranks agree there, through the directory rather than a
   collective, because an asynchronous save (``save_async``) runs in each rank's writer thread, where a
   collective would race the training step's own collectives;
3. rank 0 checks every shard against its record, writes ``trainer.json``, the manifest and the manifest's digest
   (last: ``trainer.checkpoint.manifest.write_manifest``), renames the directory into place and only then moves ``latest`` (both under the output_dir's fence, as for one writer:
   a run that lost its output_dir writes nothing). A rank that failed, or that does not report within
   :data:`WAIT_S`, is named in the error; the previous checkpoints and ``latest`` stay as they were.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from typing import Optional

import paddle

from ..errors import TrainingError
from .manifest import sha256_file, write_manifest
from .shards import SHARDED_FORMAT_VERSION
from .store import note_verified, write_run_id
from . import fence
from .writer import _fsync_file, _publish_latest, _write_json, move_into_place, owner_dir_of, save_failed, save_tensors
from .writer import write_snapshot

#: How long rank 0 waits for the other ranks' shards (seconds) before it gives the save up.
WAIT_S = 1800.0


def write(snap: dict, final: str, publish_root: Optional[str]) -> str:
    """Write this rank's part of the checkpoint ``final``; on rank 0, complete it and move ``latest``."""
    if "shard" not in snap:
        return write_snapshot(snap, final, publish_root)
    owner_dir = owner_dir_of(final)
    try:
        fence.check(owner_dir)  # a run that lost its output_dir writes nothing, not even its shard
        return _write_sharded(snap, final, publish_root, owner_dir)
    except OSError as exc:
        raise save_failed(exc, final, owner_dir) from exc


def temporary_dir(final: str, writer_pid: int) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(final)), f".tmp-{os.path.basename(final)}-{writer_pid}")


def _write_sharded(snap: dict, final: str, publish_root: Optional[str], owner_dir: str) -> str:
    info = snap["shard"]
    rank, tmp = info["rank"], temporary_dir(final, info["writer_pid"])
    os.makedirs(tmp, exist_ok=True)
    try:
        record = {"rank": rank, "token": info["token"], "file": None}
        if snap["tensors"]:
            target = os.path.join(tmp, info["file"])
            size, digest = save_tensors(snap["tensors"], target)  # hashed as written
            _fsync_file(target)
            record.update(file=info["file"], bytes=size, sha256=digest)
        _leave_record(tmp, rank, ".json", record)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            _leave_record(tmp, rank, ".failed", {"token": info["token"], "error": f"{type(exc).__name__}: {exc}"})
        raise
    if rank != 0:
        return final
    try:
        records = _wait_for_ranks(tmp, info, final)
        files = {}
        for rec in records:
            if rec["file"] is None:
                continue
            full = os.path.join(tmp, rec["file"])
            if not os.path.isfile(full) or os.path.getsize(full) != rec["bytes"]:
                raise TrainingError(f"saving checkpoint {final} failed: the shard of rank {rec['rank']} ({rec['file']}) "
                                    "is missing or not the size its rank wrote; the previous checkpoints are kept")
            files[rec["file"]] = {"bytes": rec["bytes"], "sha256": rec["sha256"], "rank": rec["rank"]}
        meta_path = os.path.join(tmp, "trainer.json")
        _write_json(meta_path, snap["meta"])
        _fsync_file(meta_path)
        files["trainer.json"] = {"bytes": os.path.getsize(meta_path), "sha256": sha256_file(meta_path)}
        for name in os.listdir(tmp):
            if name.startswith(".rank-"):
                os.remove(os.path.join(tmp, name))
        write_manifest(tmp, {
            "format_version": SHARDED_FORMAT_VERSION, "step": snap["step"], "time": time.time(),
            "run_id": snap.get("run_id", ""), "versions": {"paddle": paddle.__version__, "format": SHARDED_FORMAT_VERSION},
            "layout": snap["meta"].get("layout", {}), "files": files, "tensors": snap["index"]})
        move_into_place(tmp, final, owner_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    note_verified(final)
    if publish_root is not None:
        write_run_id(publish_root, snap.get("run_id", ""))
        _publish_latest(publish_root, os.path.basename(final))
    return final


def _leave_record(tmp: str, rank: int, suffix: str, value: dict) -> None:
    part = os.path.join(tmp, f".rank-{rank}{suffix}.part")
    with open(part, "w", encoding="utf-8") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, os.path.join(tmp, f".rank-{rank}{suffix}"))


def _read_record(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


def _wait_for_ranks(tmp: str, info: dict, final: str) -> list:
    """Every rank's record of this save (its token), in rank order; TrainingError naming a rank that failed or
    that did not report within :data:`WAIT_S`."""
    world, token = info["world_size"], info["token"]
    found: dict = {}
    deadline, pause = time.monotonic() + WAIT_S, 0.005
    while True:
        for rank in range(world):
            if rank in found:
                continue
            failed = _read_record(os.path.join(tmp, f".rank-{rank}.failed"))
            if failed is not None and failed.get("token") == token:
                raise TrainingError(f"saving checkpoint {final} failed: rank {rank} could not write its shard "
                                    f"({failed.get('error')}); the previous checkpoints are kept")
            rec = _read_record(os.path.join(tmp, f".rank-{rank}.json"))
            if rec is not None and rec.get("token") == token:
                found[rank] = rec
        if len(found) == world:
            return [found[r] for r in range(world)]
        if time.monotonic() > deadline or not os.path.isdir(tmp):
            missing = sorted(set(range(world)) - set(found))
            raise TrainingError(f"saving checkpoint {final} failed: rank(s) {missing} did not report their shard "
                                f"within {WAIT_S:.0f} s; the previous checkpoints are kept")
        time.sleep(pause)
        pause = min(pause * 2, 0.2)

