"""Checkpoint files: write complete-or-nothing, read back only what verifies.

Layout of ``output_dir/checkpoints/step-<N>/``::

    model.safetensors       the unwrapped model's state_dict
    optimizer.safetensors   optimizer tensors, keyed by structured parameter names
    trainer.json            optimizer scalars, scheduler, TrainerState, callbacks,
                            RNG states, args, world size
    manifest.json           files, byte sizes and sha256; written last

No pickle anywhere: tensors go to safetensors, the rest to JSON, so loading a
checkpoint cannot run code. Rank 0 writes into ``.tmp-step-<N>``, fsyncs every
file, renames the directory into place, and only then moves the ``latest``
pointer (itself written to a temporary file and ``os.replace``-d). A failed
save leaves the previous checkpoints and ``latest`` untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from typing import Dict, Optional, Tuple

import numpy as np
import paddle
from safetensors.numpy import load_file as np_load_file
from safetensors.numpy import save_file as np_save_file

from . import distributed as dist
from .errors import ConfigError, DataError

FORMAT_VERSION = 1
LATEST = "latest"
MANIFEST = "manifest.json"


def checkpoints_dir(output_dir: str) -> str:
    return os.path.join(output_dir, "checkpoints")


# ---- tensors <-> numpy ---------------------------------------------------------
def _to_numpy(t: paddle.Tensor) -> np.ndarray:
    if t.dtype == paddle.bfloat16:  # numpy has no bfloat16: store the bits
        return t.view(paddle.uint16).numpy() if hasattr(t, "view") else t.astype("float32").numpy()
    return np.ascontiguousarray(t.numpy())


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
def rng_state() -> dict:
    py = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "paddle": [list(_jsonable_tuple(s.__getstate__())) for s in paddle.get_rng_state()],
    }


def _jsonable_tuple(t):
    return [list(x) if isinstance(x, (list, tuple)) else x for x in t]


def set_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    current = paddle.get_rng_state()
    if len(current) == len(state["paddle"]):
        restored = []
        for template, saved in zip(current, state["paddle"]):
            gen = type(template).__new__(type(template))
            gen.__setstate__(tuple(saved))
            restored.append(gen)
        paddle.set_rng_state(restored)


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


def save_checkpoint(trainer, path: Optional[str] = None) -> str:
    """Write the trainer's complete state; rank 0 writes, every rank waits."""
    state = trainer.state
    root = checkpoints_dir(trainer.args.output_dir)
    final = path or os.path.join(root, f"step-{state.global_step}")
    dist.barrier()
    if dist.is_main_process():
        _write_checkpoint(trainer, final)
        if path is None:
            _publish_latest(root, os.path.basename(final))
    dist.barrier()
    return final


def _write_checkpoint(trainer, final: str) -> None:
    parent = os.path.dirname(os.path.abspath(final))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".tmp-{os.path.basename(final)}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        model = trainer.model
        names = _param_name_map(model)
        np_save_file({k: _to_numpy(v) for k, v in model.state_dict().items()}, os.path.join(tmp, "model.safetensors"))
        opt_tensors, opt_scalars = _split_optimizer_state(trainer.optimizer.state_dict(), names)
        np_save_file(opt_tensors, os.path.join(tmp, "optimizer.safetensors"))
        scheduler = trainer.lr_scheduler.state_dict() if trainer.lr_scheduler is not None else None
        _write_json(os.path.join(tmp, "trainer.json"), {
            "format_version": FORMAT_VERSION,
            "optimizer_scalars": _plain(opt_scalars),
            "lr_scheduler": _plain(scheduler),
            "state": trainer.state.state_dict(),
            "callbacks": _plain(trainer.callbacks.state_dict()),
            "rng": rng_state(),
            "args": trainer.args.to_dict(),
            "world_size": trainer.world_size,
        })
        files = {}
        for name in sorted(os.listdir(tmp)):
            full = os.path.join(tmp, name)
            _fsync_file(full)
            files[name] = {"bytes": os.path.getsize(full), "sha256": _sha256(full)}
        _write_json(os.path.join(tmp, MANIFEST), {
            "format_version": FORMAT_VERSION, "step": trainer.state.global_step, "time": time.time(),
            "paddle": paddle.__version__, "files": files})
        _fsync_file(os.path.join(tmp, MANIFEST))
        _fsync_dir(tmp)
        if os.path.exists(final):  # re-saving the same step: swap atomically enough
            old = final + f".old-{os.getpid()}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _publish_latest(root: str, name: str) -> None:
    tmp = os.path.join(root, f".{LATEST}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(root, LATEST))
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
def resolve(path: str, output_dir: str) -> Optional[str]:
    """A checkpoint directory from ``path`` (``auto`` = latest complete in output_dir, or None)."""
    if path == "auto":
        pointer = os.path.join(checkpoints_dir(output_dir), LATEST)
        if not os.path.isfile(pointer):
            return None
        with open(pointer, encoding="utf-8") as f:
            return os.path.join(checkpoints_dir(output_dir), f.read().strip())
    if not os.path.isdir(path):
        raise ConfigError(f"resume_from_checkpoint={path!r} does not exist: give a checkpoint directory or 'auto'")
    return path


def verify(path: str) -> dict:
    """Check every file against the manifest; return the manifest."""
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise DataError(f"{path} has no {MANIFEST}: it is not a complete checkpoint")
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    for name, meta in manifest["files"].items():
        full = os.path.join(path, name)
        if not os.path.isfile(full) or os.path.getsize(full) != meta["bytes"] or _sha256(full) != meta["sha256"]:
            raise DataError(f"checkpoint file {full} is missing or does not match its manifest: the checkpoint is damaged")
    return manifest


def load_checkpoint(trainer, path: str) -> Optional[str]:
    """Restore everything :func:`save_checkpoint` wrote. ``auto`` with no checkpoint is a no-op."""
    resolved = resolve(path, trainer.args.output_dir)
    if resolved is None:
        return None
    verify(resolved)
    with open(os.path.join(resolved, "trainer.json"), encoding="utf-8") as f:
        meta = json.load(f)
    model_state = np_load_file(os.path.join(resolved, "model.safetensors"))
    own = trainer.model.state_dict()
    missing = sorted(set(own) - set(model_state))
    unexpected = sorted(set(model_state) - set(own))
    mismatched = sorted(k for k in set(own) & set(model_state) if list(own[k].shape) != list(model_state[k].shape))
    if missing or unexpected or mismatched:
        detail = "; ".join(part for part in (
            f"missing {missing[:5]}" if missing else "", f"unexpected {unexpected[:5]}" if unexpected else "",
            f"shape differs for {mismatched[:5]}" if mismatched else "") if part)
        raise DataError(f"checkpoint {resolved} is for another model ({detail}): resume with the model that wrote it")
    trainer.model.set_state_dict({k: paddle.to_tensor(v).astype(own[k].dtype) for k, v in model_state.items()})
    names = _param_name_map(trainer.model)
    opt_tensors = np_load_file(os.path.join(resolved, "optimizer.safetensors"))
    trainer.optimizer.set_state_dict(_join_optimizer_state(opt_tensors, meta["optimizer_scalars"], names))
    if trainer.lr_scheduler is not None and meta["lr_scheduler"] is not None:
        trainer.lr_scheduler.set_state_dict(meta["lr_scheduler"])
    trainer.state.load_state_dict(meta["state"])
    unclaimed = trainer.callbacks.load_state_dict(meta["callbacks"])
    if unclaimed and dist.is_main_process():
        import logging

        logging.getLogger("trainer").warning(
            "checkpoint %s holds state for callbacks that are not registered: %s", resolved, ", ".join(unclaimed))
    set_rng_state(meta["rng"])
    return resolved
