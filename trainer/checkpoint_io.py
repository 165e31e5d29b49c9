"""Checkpoint files: write complete-or-nothing, read back only what verifies.

Layout of ``output_dir/checkpoints/step-<N>/``::

    model.safetensors       the unwrapped model's state_dict (bfloat16 stored as float32)
    optimizer.safetensors   optimizer tensors, keyed by structured parameter names
    trainer.json            optimizer scalars, scheduler, TrainerState, callbacks,
                            RNG states of every rank, args, world size, the training
                            set's length (train_samples), the partial logging window
                            (loss_window: loss sum averaged over ranks, steps), and
                            whether the accumulation was set for a new world size
    manifest.json           files, byte sizes and sha256, step, time, versions; written
                            last. A format_version other than SUPPORTED_FORMAT_VERSIONS
                            makes verify() refuse the checkpoint.

No pickle anywhere: tensors go to safetensors, the rest to JSON, so loading a
checkpoint cannot run code.

Saving is two phases. :func:`snapshot` runs at the step on every rank: it
gathers each rank's RNG state to rank 0 and copies the replicated state to host
memory. :func:`write_snapshot` then runs on rank 0, in :class:`CheckpointWriter`'s
background thread or inline: it writes into ``.tmp-step-<N>-<pid>``, fsyncs
every file, renames the directory into place, and only then moves the
``latest`` pointer (written to a temporary file and ``os.replace``-d). A failed
or killed save leaves the previous checkpoints and ``latest`` untouched; its
temporary directory is removed by the next save.
"""

from __future__ import annotations

import errno
import hashlib
import contextlib
import json
import logging
import os
import random
import re
import shutil
import threading
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import paddle
from safetensors.numpy import load_file as np_load_file
from safetensors.numpy import save_file as np_save_file

from . import distributed as dist
from .errors import ConfigError, DataError
from .lock import pid_alive
from .tensors import to_numpy

logger = logging.getLogger("trainer.checkpoint")
FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = (1,)  # manifests this code reads; any other version is refused by verify()
LATEST = "latest"
MANIFEST = "manifest.json"


def checkpoints_dir(output_dir: str) -> str:
    return os.path.join(output_dir, "checkpoints")


# ---- tensors <-> numpy ---------------------------------------------------------
def _to_numpy(t: paddle.Tensor) -> np.ndarray:
    return to_numpy(t, keep_float16=True)  # numpy has no bfloat16: float32 holds every bfloat16 value exactly


def _param_name_map(model: paddle.nn.Layer) -> Dict[str, str]:
    """paddle's unique parameter names (``linear_0.w_0``) -> structured names (``fc.weight``)."""
    return {p.name: name for name, p in model.named_parameters()}


def _split_optimizer_state(opt_state: dict, names: Dict[str, str]) -> Tuple[dict, dict]:
    """Tensors (renamed to structured names) and JSON scalars of an optimizer state_dict."""
    tensors, scalars = {}, {}
    by_len = sorted(names, key=len, reverse=True)

    def rename(key: str) -> str:
        for raw in by_len:
            if key.startswith(raw + "_") or key == raw:
                return "param:" + names[raw] + key[len(raw):]
        return key

    for key, value in opt_state.items():
        if key == "LR_Scheduler":
            scalars[key] = value
        elif key == "master_weights" and isinstance(value, dict):
            for raw, t in value.items():
                tensors["master:" + names.get(raw, raw)] = _to_numpy(t)
        elif isinstance(value, paddle.Tensor):
            tensors[rename(key)] = _to_numpy(value)
        else:
            scalars[key] = value
    return tensors, scalars


def _join_optimizer_state(tensors: dict, scalars: dict, names: Dict[str, str]) -> dict:
    back = {structured: raw for raw, structured in names.items()}
    out: dict = dict(scalars)
    masters = {}
    for key, array in tensors.items():
        if key.startswith("master:"):
            structured = key[len("master:"):]
            masters[back.get(structured, structured)] = paddle.to_tensor(array)
            continue
        if key.startswith("param:"):
            rest = key[len("param:"):]
            for structured in sorted(back, key=len, reverse=True):
                if rest.startswith(structured + "_") or rest == structured:
                    key = back[structured] + rest[len(structured):]
                    break
        out[key] = paddle.to_tensor(array)
    if masters:
        out["master_weights"] = masters
    return out


# ---- RNG ---------------------------------------------------------------------------
# paddle.get_rng_state() returns the generators of the current place's kind: on a GPU place the
# CUDA generators of every visible card and not the CPU one (which CPU-side ops and DataLoader
# seeding use), and their number depends on CUDA_VISIBLE_DEVICES. So each rank saves its CPU
# generator and its own card's CUDA generator by name; a generator the checkpoint lacks, or
# this run lacks, is named in a warning instead of being skipped silently.
def rng_generators() -> dict:
    """This process's paddle generators: ``{"cpu": Generator, "cuda": (device id, Generator) or None}``."""
    from paddle.base import core

    device = paddle.get_device()
    cuda = None
    if device.startswith("gpu"):
        device_id = int(device.partition(":")[2] or 0)
        cuda = (device_id, core.default_cuda_generator(device_id))
    return {"cpu": core.default_cpu_generator(), "cuda": cuda}


def rng_state(generators: Optional[dict] = None) -> dict:
    """Python, numpy and paddle RNG states of this process, as JSON values."""
    gens = generators or rng_generators()
    py = random.getstate()
    np_state = np.random.get_state()
    cuda = gens["cuda"]
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "paddle_cpu": _generator_to_json(gens["cpu"]),
        "paddle_cuda": None if cuda is None else {"device": f"gpu:{cuda[0]}", "state": _generator_to_json(cuda[1])},
    }


def _generator_to_json(generator) -> list:
    return [list(x) if isinstance(x, (list, tuple)) else x for x in generator.get_state().__getstate__()]


def _generator_from_json(generator, saved: list) -> None:
    template = generator.get_state()
    state = type(template).__new__(type(template))
    state.__setstate__(tuple(saved))
    generator.set_state(state)


def set_rng_state(state: dict, generators: Optional[dict] = None) -> List[str]:
    """Restore what ``rng_state`` saved; return (and log as a warning) what could not be restored.

    Also reads the layout of earlier checkpoints (``"paddle"``: the list
    ``paddle.get_rng_state()`` gave), restoring it where it fits this place.
    """
    gens = generators or rng_generators()
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    cuda = gens["cuda"]
    here = f"gpu:{cuda[0]}" if cuda is not None else "cpu"
    missed: List[str] = []
    if "paddle_cpu" in state:
        _generator_from_json(gens["cpu"], state["paddle_cpu"])
        saved_cuda = state.get("paddle_cuda")
        if saved_cuda is not None and cuda is not None:
            _generator_from_json(cuda[1], saved_cuda["state"])  # this rank's card, whatever its number
        elif saved_cuda is not None:
            missed.append(f"the CUDA generator saved on {saved_cuda['device']} (this run is on CPU)")
        elif cuda is not None:
            missed.append(f"the CUDA generator of {here} (the checkpoint was written on CPU)")
    else:  # format of earlier versions: the generators of the place it was saved on
        saved = state.get("paddle") or []
        if cuda is None and len(saved) == 1:
            _generator_from_json(gens["cpu"], saved[0])
        elif cuda is not None and len(saved) == paddle.device.cuda.device_count():
            _generator_from_json(cuda[1], saved[cuda[0]])
            missed.append("the CPU generator (an older checkpoint written on GPU does not hold it)")
        else:
            missed.append(f"paddle's generators ({len(saved)} saved by an older checkpoint, which do not match "
                          f"this run on {here})")
    if missed:
        logger.warning("rank %d resumes without restoring %s: random draws on that generator (dropout, random "
                       "augmentation on the device) differ from an uninterrupted run", dist.get_rank(),
                       "; ".join(missed))
    return missed


# ---- files ---------------------------------------------------------------------------
def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
    """

    def __init__(self):
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    def submit(self, job, background: bool) -> None:
        self.wait()
        if not background:
            job()
            return
        self._thread = threading.Thread(target=self._run, args=(job,), name="checkpoint-writer", daemon=True)
        self._thread.start()

    def _run(self, job) -> None:
        try:
            job()
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread
            self._error = exc

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
            from .errors import TrainingError

            if isinstance(error, TrainingError):  # already names the checkpoint and the file
                raise error
            raise TrainingError(f"saving a checkpoint failed: {type(error).__name__}: {error}") from error


def snapshot(trainer) -> dict:
    """Copy everything a checkpoint holds to host memory (the only part that runs at the step).

    A collective: every rank must call it. Rank-local state (RNG) of every
    rank is gathered to rank 0; the rest is replicated and taken from rank 0.
    """
    rank_states = _gather_json(rng_state())
    loss_window = _loss_window(trainer)  # a collective too: the partial logging window, averaged over ranks
    if not dist.is_main_process():
        return {}
    model = trainer.model
    names = _param_name_map(model)
    opt_tensors, opt_scalars = _split_optimizer_state(trainer.optimizer.state_dict(), names)
    scheduler = trainer.lr_scheduler.state_dict() if trainer.lr_scheduler is not None else None
    return {
        "model": {k: _to_numpy(v) for k, v in model.state_dict().items()},
        "optimizer": opt_tensors,
        "meta": {
            "format_version": FORMAT_VERSION,
            "optimizer_scalars": _plain(opt_scalars),
            "lr_scheduler": _plain(scheduler),
            "state": trainer.state.state_dict(),
            "callbacks": _plain(trainer.callbacks.state_dict()),
            "rng_per_rank": rank_states,
            "args": trainer.args.to_dict(),
            "world_size": trainer.world_size,
            "train_samples": getattr(getattr(trainer, "_train_sampler", None), "dataset_len", None),
            "accumulation_adapted": bool(getattr(trainer, "accumulation_adapted", False)),  # trainer.resume_check
            "loss_window": loss_window,
        },
        "step": trainer.state.global_step,
        "run_id": trainer.state.run_id,
    }


def _loss_window(trainer) -> Optional[dict]:
    """The loss summed since the last log record (mean over ranks) and the steps in it, so a resumed run logs
    the same value for the window that spans the interruption. One host read, at a save."""
    steps = getattr(trainer, "_loss_steps", 0)
    if not steps:
        return None
    return {"sum": float(dist.all_reduce_mean(trainer._loss_sum)), "steps": int(steps)}


def _gather_json(value) -> list:
    """Every rank's JSON-able ``value``, in rank order (on every rank)."""
    if not dist.is_distributed():
        return [value]
    data = np.frombuffer(json.dumps(value).encode("utf-8"), dtype=np.uint8)
    local = paddle.to_tensor(data.astype("int32")).reshape([1, -1])
    sizes = _gather_sizes(local.shape[1])
    padded = paddle.concat([local, paddle.zeros([1, max(sizes) - local.shape[1]], dtype="int32")], axis=1) \
        if local.shape[1] < max(sizes) else local
    rows = dist.all_gather_uneven(padded).numpy()
    return [json.loads(bytes(row[:n].astype(np.uint8)).decode("utf-8")) for row, n in zip(rows, sizes)]


def _gather_sizes(n: int) -> list:
    t = dist.all_gather_uneven(paddle.to_tensor([n], dtype="int64"))
    return [int(v) for v in t.numpy()]


def write_snapshot(snap: dict, final: str, publish_root: Optional[str]) -> str:
    """Write a snapshot into ``final`` (complete or not at all); then move ``latest``.

    An OSError becomes a TrainingError naming the file (a full disk, a read-only directory).
    """
    try:
        _write_checkpoint(snap, final)
        if publish_root is not None:
            _publish_latest(publish_root, os.path.basename(final))
    except OSError as exc:
        from .errors import TrainingError

        where = exc.filename or final
        why = "the disk is full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise TrainingError(f"saving checkpoint {final} failed: {why} writing {where}; the previous checkpoints are "
                            "kept: free space or fix the permissions, then resume with --resume_from_checkpoint auto") from exc
    return final


def _write_checkpoint(snap: dict, final: str) -> None:
    parent = os.path.dirname(os.path.abspath(final))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".tmp-{os.path.basename(final)}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        for part in ("model", "optimizer"):
            target = os.path.join(tmp, f"{part}.safetensors")
            try:
                np_save_file(snap[part], target)
            except Exception as exc:  # safetensors raises its own error, without the file's name
                found = re.search(r"os error (\d+)", str(exc))
                code = getattr(exc, "errno", None) or (int(found[1]) if found else None)
                if not code:
                    raise
                raise OSError(code, os.strerror(code), target) from exc
        _write_json(os.path.join(tmp, "trainer.json"), snap["meta"])
        files = {}
        for name in sorted(os.listdir(tmp)):
            full = os.path.join(tmp, name)
            _fsync_file(full)
            files[name] = {"bytes": os.path.getsize(full), "sha256": _sha256(full)}
        _write_json(os.path.join(tmp, MANIFEST), {
            "format_version": FORMAT_VERSION, "step": snap["step"], "time": time.time(), "run_id": snap.get("run_id", ""),
            "versions": {"paddle": paddle.__version__, "format": FORMAT_VERSION}, "files": files})
        _fsync_file(os.path.join(tmp, MANIFEST))
        _fsync_dir(tmp)
        if os.path.exists(final):  # re-saving the same step: move the old one aside, then replace
            old = os.path.join(parent, f".old-{os.path.basename(final)}-{os.getpid()}")
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_stale_temporaries(root: str) -> None:
    """Delete ``.tmp-*``/``.old-*``/``.deleting-*`` directories and ``.latest.tmp-*`` files left by a process
    that died mid-save or mid-rotation (rank 0, at the start of fit() and before a save)."""
    if not os.path.isdir(root):
        return
    for name in os.listdir(root):
        if name.startswith((".tmp-", ".old-", ".deleting-", f".{LATEST}.tmp-")):
            pid = name.rsplit("-", 1)[-1]
            if name.startswith(".deleting-") or not (pid.isdigit() and (int(pid) == os.getpid() or pid_alive(int(pid)))):
                full = os.path.join(root, name)
                if os.path.isdir(full) and not os.path.islink(full):
                    shutil.rmtree(full, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.remove(full)


def _publish_latest(root: str, name: str) -> None:
    tmp = os.path.join(root, f".{LATEST}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(root, LATEST))
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    _fsync_dir(root)


def _plain(value):
    """JSON-able copy: tensors and numpy become lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, paddle.Tensor):
        return value.numpy().tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


# ---- reading ---------------------------------------------------------------------------
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


def checkpoint_run_id(path: str) -> Optional[str]:
    """The run id a checkpoint's manifest records ("" for checkpoints written before run ids; None when
    the manifest is missing or unreadable)."""
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        return str(manifest.get("run_id", "")) if isinstance(manifest, dict) else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def resolve(path: str, output_dir: str) -> Optional[str]:
    """The checkpoint to resume from.

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
        verify(path)
        return path
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
            verify(candidate)
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
        return candidate
    if dist.is_main_process() and skipped:
        logger.warning("resume auto: no checkpoint verifies, starting fresh; skipped: %s", "; ".join(skipped))
    return None


def verify(path: str) -> dict:
    """Check every file against the manifest; return the manifest."""
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise DataError(f"{path} has no {MANIFEST}: it is not a complete checkpoint")
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
        files = manifest["files"]
        if not isinstance(files, dict) or not {"model.safetensors", "trainer.json"} <= set(files):
            raise ValueError("it lists no model.safetensors or trainer.json")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise DataError(f"{manifest_path} is unreadable ({exc}): the checkpoint is damaged") from None
    version = manifest.get("format_version")
    if isinstance(version, bool) or version not in SUPPORTED_FORMAT_VERSIONS:
        raise DataError(f"{manifest_path} has format_version {version!r}, which this paddle-trainer does not read "
                        f"(it reads {', '.join(map(str, SUPPORTED_FORMAT_VERSIONS))}): resume with the paddle-trainer "
                        "version that wrote it, or start a fresh run")
    for name, meta in files.items():
        if os.path.basename(name) != name:
            raise DataError(f"{manifest_path} names a file outside the checkpoint ({name!r}): the checkpoint is damaged")
        if not (isinstance(meta, dict) and isinstance(meta.get("bytes"), int) and isinstance(meta.get("sha256"), str)):
            raise DataError(f"{manifest_path} has a malformed entry for {name!r}: the checkpoint is damaged")
        full = os.path.join(path, name)
        if not os.path.isfile(full) or os.path.getsize(full) != meta["bytes"] or _sha256(full) != meta["sha256"]:
            raise DataError(f"checkpoint file {full} is missing or does not match its manifest: the checkpoint is damaged")
    return manifest


def read_checkpoint(path: str) -> Tuple[dict, dict, dict]:
    """(meta, model tensors, optimizer tensors) of a verified checkpoint, or DataError."""
    try:
        with open(os.path.join(path, "trainer.json"), encoding="utf-8") as f:
            meta = json.load(f)
        model_state = np_load_file(os.path.join(path, "model.safetensors"))
        opt_tensors = np_load_file(os.path.join(path, "optimizer.safetensors"))
        for key in ("optimizer_scalars", "lr_scheduler", "state", "callbacks", "rng_per_rank", "args", "world_size"):
            meta[key]  # noqa: B018 - presence check
        if not (isinstance(meta["callbacks"], dict) and isinstance(meta["rng_per_rank"], list)):
            raise ValueError("trainer.json has fields of the wrong type")
        check_meta(meta)
    except Exception as exc:  # noqa: BLE001 - any defect of the files is a damaged checkpoint
        raise DataError(f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc}): it is damaged or "
                        "from an incompatible version") from None
    return meta, model_state, opt_tensors


def _count(value, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def check_meta(meta: dict) -> None:
    """Raise ValueError when the fields resume reads before loading have the wrong type (a damaged trainer.json)."""
    args, state, window = meta.get("args"), meta.get("state"), meta.get("loss_window")
    if not (isinstance(args, dict) and isinstance(state, dict) and _count(meta.get("world_size"), 1)
            and _count(args.get("per_device_train_batch_size"), 1) and _count(args.get("gradient_accumulation_steps"), 1)
            and _count(state.get("global_step", 0), 0) and all(_count(state.get(k, 0), 0) for k in ("max_steps", "steps_per_epoch"))
            and (meta.get("train_samples") is None or _count(meta.get("train_samples"), 1))
            and (window is None or (isinstance(window, dict) and _count(window.get("steps"), 1)
                                    and isinstance(window.get("sum"), (int, float))
                                    and not isinstance(window.get("sum"), bool)))):
        raise ValueError("trainer.json has fields of the wrong type")


def load_checkpoint(trainer, path: str) -> Optional[str]:
    """Restore everything :func:`snapshot` took. ``auto`` with no checkpoint is a no-op (returns None).

    Every file is read and checked before anything is changed; state that
    still cannot be applied raises DataError, so no run trains on a
    half-restored state.
    """
    resolved = resolve(path, trainer.args.output_dir)
    if resolved is None:
        return None
    meta, model_state, opt_tensors = read_checkpoint(resolved)
    own = trainer.model.state_dict()
    missing = sorted(set(own) - set(model_state))
    unexpected = sorted(set(model_state) - set(own))
    mismatched = sorted(k for k in set(own) & set(model_state) if list(own[k].shape) != list(model_state[k].shape))
    if missing or unexpected or mismatched:
        detail = "; ".join(part for part in (
            f"missing {missing[:5]}" if missing else "", f"unexpected {unexpected[:5]}" if unexpected else "",
            f"shape differs for {mismatched[:5]}" if mismatched else "") if part)
        raise DataError(f"checkpoint {resolved} is for another model ({detail}): resume with the model that wrote it")
    try:
        adapt_to_world_size(trainer, meta)
        trainer.model.set_state_dict({k: paddle.to_tensor(v).astype(own[k].dtype) for k, v in model_state.items()})
        names = _param_name_map(trainer.model)
        trainer.optimizer.set_state_dict(_join_optimizer_state(opt_tensors, meta["optimizer_scalars"], names))
        if trainer.lr_scheduler is not None and meta["lr_scheduler"] is not None:
            trainer.lr_scheduler.set_state_dict(meta["lr_scheduler"])
        trainer.state.load_state_dict(meta["state"])
        unclaimed = trainer.callbacks.load_state_dict(meta["callbacks"])
        window = meta.get("loss_window")
        if window:  # every rank carries the ranks' mean: the logged mean over ranks comes out the same
            trainer._loss_sum = paddle.to_tensor(window["sum"], dtype="float32")
            trainer._loss_steps = int(window["steps"])
        if meta["world_size"] == dist.get_world_size():
            set_rng_state(meta["rng_per_rank"][dist.get_rank()])
        else:
            logger.warning("checkpoint %s was written by %d processes, this run has %d: the RNG states are not "
                           "restored", resolved, meta["world_size"], dist.get_world_size())
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - paddle's set_state_dict raises asserts and RuntimeErrors
        raise DataError(f"checkpoint {resolved} holds state this run cannot take ({type(exc).__name__}: {exc}): "
                        "it is damaged or from an incompatible version") from None
    if unclaimed and dist.is_main_process():
        logger.warning(
            "checkpoint %s holds state for callbacks that are not registered: %s", resolved, ", ".join(unclaimed))
    return resolved


def adapt_to_world_size(trainer, meta: dict) -> None:
    """Resuming on another number of processes keeps the global batch through accumulation
    (``trainer.resume_check.plan_world_size``; fit() has applied it before planning the schedule)."""
    from .resume_check import plan_world_size

    plan_world_size(trainer.args, meta, trainer.world_size)
