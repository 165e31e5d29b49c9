"""The checkpoint's files and manifest: names, format version, checks, reading a verified checkpoint.

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
checkpoint cannot run code. :func:`verify` checks every file against the
manifest; :func:`read_checkpoint` reads a verified one.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Optional, Tuple

from safetensors.numpy import load_file as np_load_file

from ..errors import DataError

FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = (1,)  # manifests this code reads; any other version is refused by verify()
LATEST = "latest"
MANIFEST = "manifest.json"


class UnsupportedFormat(DataError):
    """A manifest whose ``format_version`` this version does not read: not damaged, so never set aside."""


def checkpoints_dir(output_dir: str) -> str:
    return os.path.join(output_dir, "checkpoints")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()



def checkpoint_run_id(path: str) -> Optional[str]:
    """The run id a checkpoint's manifest records ("" for checkpoints written before run ids; None when
    the manifest is missing or unreadable)."""
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        return str(manifest.get("run_id", "")) if isinstance(manifest, dict) else None
    except (OSError, ValueError, UnicodeDecodeError):
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
        raise UnsupportedFormat(f"{manifest_path} has format_version {version!r}, which this paddle-trainer does not read "
                        f"(it reads {', '.join(map(str, SUPPORTED_FORMAT_VERSIONS))}): resume with the paddle-trainer "
                        "version that wrote it, or start a fresh run")
    for name, meta in files.items():
        if os.path.basename(name) != name:
            raise DataError(f"{manifest_path} names a file outside the checkpoint ({name!r}): the checkpoint is damaged")
        if not (isinstance(meta, dict) and isinstance(meta.get("bytes"), int) and isinstance(meta.get("sha256"), str)):
            raise DataError(f"{manifest_path} has a malformed entry for {name!r}: the checkpoint is damaged")
        full = os.path.join(path, name)
        if not os.path.isfile(full) or os.path.getsize(full) != meta["bytes"] or sha256_file(full) != meta["sha256"]:
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
    identity = meta.get("identity")
    if identity is not None and not (isinstance(identity, dict)
                                     and isinstance(identity.get("fields", {}), dict)
                                     and isinstance(identity.get("may_change", {}), dict)
                                     and isinstance(identity.get("split", []), list)):
        raise ValueError("trainer.json has an identity of the wrong type")


