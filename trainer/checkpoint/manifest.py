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
                            last but one. A format_version other than
                            SUPPORTED_FORMAT_VERSIONS is not read: verify() skips it
                            (UnsupportedFormat) before anything else is checked.
    manifest.sha256         the manifest's own sha256 (``sha256sum`` format), written
                            last: a reader checks the manifest against it before it
                            trusts a byte of it, so an edited manifest (two tensors
                            swapped in the index, every shard still matching) is damaged.

A layout whose ranks hold different state (sharding) writes format 2 instead: ``trainer.json``,
one ``shard-RRRRR-of-WWWWW.safetensors`` per rank in place of the two tensor files, and a manifest
that also records the layout and the ``tensors`` index that reassembles them (``shards``).

The digest is an addition to formats 1 and 2, not a new format: the previous release reads these
checkpoints as before (it ignores the file), and its own checkpoints, which have no digest, are read
as before too, verified by their files' sha256 (their manifest says nothing of a digest:
``manifest_digest`` absent). A manifest that names its digest file, or a digest file beside any
manifest, must match. ``trainer.json`` records the names of the tensors the save wrote
(``trainer.checkpoint.contents``): files that lack one are a damaged checkpoint.

No pickle anywhere: tensors go to safetensors, the rest to JSON, so loading a
checkpoint cannot run code. :func:`verify` checks every file against the
manifest; :func:`read_verified` reads each file once, hashing it while it is
read (the bytes are checked against the manifest before they are parsed), and
returns a :class:`VerifiedCheckpoint` that resume hands on to the load, so the
chosen checkpoint is read and verified once; :func:`read_checkpoint` is the
same read as a tuple.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from typing import Dict, NamedTuple, Optional, Tuple

import numpy as np
from safetensors.numpy import load as np_load_bytes
from safetensors.numpy import load_file as np_load_file  # noqa: F401 - callbacks.load_best reads weights with it

from ..errors import DataError
from . import contents
from .shards import SHARDED_FORMAT_VERSION, assemble, check_index

FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = (1, SHARDED_FORMAT_VERSION)  # manifests this code reads; any other version is refused by verify()
LATEST = "latest"
MANIFEST = "manifest.json"
MANIFEST_DIGEST = "manifest.sha256"  # the manifest's own sha256: written after it, checked before it is trusted


class UnsupportedFormat(DataError):
    """A manifest whose ``format_version`` this version does not read: not damaged, so never set aside."""


def checkpoints_dir(output_dir: str) -> str:
    return os.path.join(output_dir, "checkpoints")


CHUNK = 8 << 20  # bytes hashed at a time


def sha256_file(path: str) -> str:
    return read_hashed(path, keep=False)[1]


def read_hashed(path: str, keep: bool = True) -> Tuple[Optional[memoryview], str]:
    """(the file's bytes, their sha256) in one pass over the file.

    The file is mapped (``mmap``) and hashed through the mapping: hashing is what reads it from
    the disk or the page cache, and the bytes returned are the same pages, so parsing them reads
    nothing again and copies nothing (a tensor built from them is the one copy). ``keep=False``:
    hash only (bytes None). Checkpoint files are written whole and renamed into place, never
    changed in place, so what was hashed is what is parsed.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return (memoryview(b"") if keep else None), h.hexdigest()
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapped)
    if hasattr(mapped, "madvise"):
        mapped.madvise(mmap.MADV_SEQUENTIAL)  # read ahead while hashing
    for start in range(0, size, CHUNK):
        h.update(view[start:start + CHUNK])  # releases the GIL
    if keep:
        return view, h.hexdigest()
    view.release()
    mapped.close()
    return None, h.hexdigest()


def checkpoint_run_id(path: str) -> Optional[str]:
    """The run id a checkpoint's manifest records ("" for checkpoints written before run ids; None when
    the manifest is missing or unreadable)."""
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        return str(manifest.get("run_id", "")) if isinstance(manifest, dict) else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None




def write_manifest(directory: str, manifest: dict) -> str:
    """Write ``manifest`` as ``directory/manifest.json``, then its sha256 as ``manifest.sha256``, each fsynced; the
    digest (the writers call this last, before the directory is renamed into place)."""
    manifest = dict(manifest, manifest_digest=MANIFEST_DIGEST)
    data = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
    digest = hashlib.sha256(data).hexdigest()
    for name, content in ((MANIFEST, data), (MANIFEST_DIGEST, f"{digest}  {MANIFEST}\n".encode("ascii"))):
        with open(os.path.join(directory, name), "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
    return digest


def _recorded_digest(path: str) -> Optional[str]:
    """The digest ``manifest.sha256`` records (None when there is no such file; "" when it is unreadable)."""
    try:
        with open(os.path.join(path, MANIFEST_DIGEST), "rb") as f:
            words = f.read(256).split()
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    return words[0].decode("ascii", "replace").lower() if words else ""


def _foreign_trainer_files(path: str) -> list:
    """The files that mark ``path`` as a PaddleFormers or PaddleNLP Trainer checkpoint (none: it is not one)."""
    marks = ("trainer_state.bin", "trainer_state.json", "training_args.bin", "rng_state_0.pth", "rng_state.pth")
    found = [name for name in marks if os.path.isfile(os.path.join(path, name))]
    return found if "training_args.bin" in found else []


def read_manifest(path: str) -> dict:
    """The checked manifest of the checkpoint at ``path`` (files, sizes, sha256 and format version), or DataError.

    In this order: the manifest parses; its ``format_version`` is one this code reads (else
    :class:`UnsupportedFormat`: skipped, never set aside, whatever else it holds); it matches its digest
    (``manifest.sha256``, when it names one or one is there); its entries are well formed.
    """
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        foreign = _foreign_trainer_files(path)
        if foreign:  # complete, perhaps, but not ours: say so rather than call it incomplete
            raise DataError(f"{path} is a PaddleFormers/PaddleNLP Trainer checkpoint ({', '.join(foreign)}), not one "
                            "this Trainer wrote: resume takes only checkpoints verified by a manifest, and its trainer "
                            "state, RNG and arguments are pickles, which are never loaded; start from its weights with "
                            f"from_pretrained('{path}'), or resume it with PaddleFormers' Trainer")
        raise DataError(f"{path} has no {MANIFEST}: it is not a complete checkpoint")
    try:
        with open(manifest_path, "rb") as f:
            raw = f.read()
        manifest = json.loads(raw.decode("utf-8"))
        if not isinstance(manifest, dict):
            raise ValueError(f"it holds a JSON {type(manifest).__name__}, not an object")
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise DataError(f"{manifest_path} is unreadable ({exc}): the checkpoint is damaged") from None
    version = manifest.get("format_version")
    if isinstance(version, bool) or version not in SUPPORTED_FORMAT_VERSIONS:
        raise UnsupportedFormat(f"{manifest_path} has format_version {version!r}, which this paddle-trainer does not read "
                                f"(it reads {', '.join(map(str, SUPPORTED_FORMAT_VERSIONS))}): it is skipped and left as "
                                "it is; resume it with the paddle-trainer version that wrote it, or start a fresh run")
    recorded = _recorded_digest(path)
    if recorded is None and "manifest_digest" in manifest:
        raise DataError(f"{manifest_path} names its digest file {MANIFEST_DIGEST}, which is missing: the manifest "
                        "cannot be trusted; the checkpoint is damaged")
    if recorded is not None and recorded != hashlib.sha256(raw).hexdigest():
        raise DataError(f"{manifest_path} does not match its digest in {MANIFEST_DIGEST}: the manifest was changed "
                        "after it was written; the checkpoint is damaged")
    try:
        files = manifest["files"]
        sharded = version == SHARDED_FORMAT_VERSION
        needed = {"trainer.json"} if sharded else {"model.safetensors", "optimizer.safetensors", "trainer.json"}
        if not isinstance(files, dict):
            raise ValueError("its files are not a mapping")
        if not needed <= set(files):
            raise ValueError(f"it lists no {' and no '.join(sorted(needed - set(files)))}")
        if sharded:
            check_index(manifest.get("tensors"))
            unlisted = sorted({p["file"] for e in manifest["tensors"].values() for p in e["parts"]} - set(files))
            if unlisted:
                raise ValueError(f"its tensors are in files it does not list: {unlisted[:3]}")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{manifest_path} is unreadable ({exc}): the checkpoint is damaged") from None
    for name, meta in files.items():
        if os.path.basename(name) != name:
            raise DataError(f"{manifest_path} names a file outside the checkpoint ({name!r}): the checkpoint is damaged")
        if name in (MANIFEST, MANIFEST_DIGEST):
            raise DataError(f"{manifest_path} lists {name}, which checks the files, among them: the checkpoint is damaged")
        if not (isinstance(meta, dict) and isinstance(meta.get("bytes"), int) and isinstance(meta.get("sha256"), str)):
            raise DataError(f"{manifest_path} has a malformed entry for {name!r}: the checkpoint is damaged")
    return manifest


def _checked_bytes(path: str, name: str, meta: dict, keep: bool) -> Optional[bytearray]:
    full = os.path.join(path, name)
    whose = f" (the shard of rank {meta['rank']})" if isinstance(meta.get("rank"), int) else ""
    if not os.path.isfile(full) or os.path.getsize(full) != meta["bytes"]:
        raise DataError(f"checkpoint file {full}{whose} is missing or does not match its manifest: the checkpoint is "
                        "damaged")
    data, digest = read_hashed(full, keep)
    if digest != meta["sha256"] or (keep and len(data) != meta["bytes"]):
        raise DataError(f"checkpoint file {full}{whose} is missing or does not match its manifest: the checkpoint is "
                        "damaged")
    return data


def verify(path: str) -> dict:
    """Check the checkpoint as a resume does, reading only its manifest, its hashes, ``trainer.json`` and the
    safetensors headers (no tensor is parsed); return the manifest. DataError for a damaged checkpoint,
    :class:`UnsupportedFormat` for one of a format this version does not read."""
    manifest = read_manifest(path)
    for name, meta in manifest["files"].items():
        _checked_bytes(path, name, meta, keep=False)
    try:
        with open(os.path.join(path, "trainer.json"), encoding="utf-8") as f:
            meta = json.load(f)
        check_trainer_json(meta)
        held = _held_keys(path, manifest)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc}): it is damaged or "
                        "from an incompatible version") from None
    _check_contents(path, meta, *held)
    return manifest


def _held_keys(path: str, manifest: dict) -> Tuple[list, list]:
    """(model keys, optimizer keys) the checkpoint's files hold, from the safetensors headers; ValueError when a part
    of a sharded checkpoint's index is not in the file it names (what :func:`~.shards.assemble` refuses)."""
    if manifest["format_version"] == SHARDED_FORMAT_VERSION:
        headers: dict = {}
        for entry in manifest["tensors"].values():
            for part in entry["parts"]:
                if part["file"] not in headers:
                    headers[part["file"]], problem = safetensors_header(os.path.join(path, part["file"]))
                    if problem:
                        raise ValueError(f"{part['file']}: {problem}")
                if part["key"] not in headers[part["file"]]:
                    raise ValueError(f"{part['file']} (rank {part['rank']}) lacks tensor {part['key']}")
        keys = [k.split("/", 1) for k in manifest["tensors"]]
        return [n for g, n in keys if g == "model"], [n for g, n in keys if g == "optimizer"]
    out = []
    for name in ("model.safetensors", "optimizer.safetensors"):
        header, problem = safetensors_header(os.path.join(path, name))
        if problem:
            raise ValueError(f"{name}: {problem}")
        out.append(list(header))
    return out[0], out[1]


def _check_contents(path: str, meta: dict, model_keys, optimizer_keys) -> None:
    """DataError naming the tensors the checkpoint's record (or its accumulators' pattern) needs and its files lack."""
    lacking = contents.missing(meta, model_keys, optimizer_keys)
    if lacking:
        raise DataError(f"checkpoint {path} lacks {contents.describe_missing(lacking)} that its trainer.json "
                        f"{'records' if contents.RECORD in meta else 'implies'}: it is damaged; resume another "
                        "checkpoint or start a fresh run")


class Verdict(NamedTuple):
    """What resume would make of a checkpoint (:func:`verdict`): ``valid``, ``damaged`` (set aside by ``auto``) or
    ``unsupported`` (skipped and left as it is), with the reason or how it was verified."""
    status: str
    text: str


def verdict(path: str) -> Verdict:
    """The one verdict on a checkpoint that ``ptrain inspect`` prints and resume acts on (:func:`verify`)."""
    try:
        manifest = verify(path)
    except UnsupportedFormat as exc:
        return Verdict("unsupported", str(exc))
    except DataError as exc:
        return Verdict("damaged", str(exc))
    files = f"{len(manifest['files'])} files match their sizes and sha256"
    if _recorded_digest(path) is not None:
        return Verdict("valid", f"valid (complete: the manifest matches its digest in {MANIFEST_DIGEST}; {files})")
    return Verdict("valid", f"valid (written before manifests carried a digest: {files}; the manifest itself is "
                            "covered by no checksum)")


class VerifiedCheckpoint(NamedTuple):
    """A checkpoint read once and checked against its manifest: what resume reads and load applies."""
    path: str
    manifest: dict
    meta: dict                       # trainer.json, its fields checked (check_meta)
    model_state: Dict[str, object]   # numpy arrays
    opt_tensors: Dict[str, object]   # numpy arrays

    def __fspath__(self) -> str:  # usable where a checkpoint path is expected (os.path.basename, open)
        return self.path


def read_verified(path: str) -> VerifiedCheckpoint:
    """Read every file of the checkpoint once, hashing while reading; verified before anything is parsed.

    DataError for a missing, damaged or unreadable checkpoint (the same verdict as :func:`verify`).
    """
    manifest = read_manifest(path)
    data = {name: _checked_bytes(path, name, meta, keep=True) for name, meta in manifest["files"].items()}
    try:
        meta = json.loads(bytes(data["trainer.json"]).decode("utf-8"))
        if manifest["format_version"] == SHARDED_FORMAT_VERSION:  # every shard verified above: put them together
            model_state, opt_tensors = assemble(manifest["tensors"], lambda name: tensors_from_buffer(data[name]))
        else:
            model_state = tensors_from_buffer(data.pop("model.safetensors"))
            opt_tensors = tensors_from_buffer(data.pop("optimizer.safetensors"))
        check_trainer_json(meta)
    except Exception as exc:  # noqa: BLE001 - any defect of the files is a damaged checkpoint
        raise DataError(f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc}): it is damaged or "
                        "from an incompatible version") from None
    _check_contents(path, meta, model_state, opt_tensors)
    return VerifiedCheckpoint(path, manifest, meta, model_state, opt_tensors)


def safetensors_header(path: str) -> Tuple[Optional[dict], Optional[str]]:
    """(the JSON header of a safetensors file: name -> dtype, shape, offsets; without reading the tensors, None) or
    (None, why it cannot be read)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                return None, "too short for a safetensors file"
            size = int.from_bytes(raw, "little")
            if size > min(os.path.getsize(path) - 8, 100 << 20):
                return None, "header length beyond the end of the file"
            header = json.loads(f.read(size).decode("utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"unreadable header ({type(exc).__name__})"
    if not isinstance(header, dict):
        return None, "header is not a JSON object"
    header.pop("__metadata__", None)
    return header, None


_NUMPY_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
                 "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def tensors_from_buffer(buf) -> Dict[str, np.ndarray]:
    """The tensors of a safetensors file held in ``buf``, as numpy arrays viewing ``buf`` (no copy).

    The format is an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
    data_offsets) and the data. A dtype numpy lacks (bfloat16) goes through the safetensors library.
    """
    n = int.from_bytes(buf[:8], "little")
    header = json.loads(bytes(buf[8:8 + n]).decode("utf-8"))
    base, out = 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _NUMPY_DTYPES.get(info["dtype"])
        if dtype is None:
            return np_load_bytes(bytes(buf))
        begin, end = (int(v) for v in info["data_offsets"])
        shape = [int(d) for d in info["shape"]]
        count = int(np.prod(shape)) if shape else 1
        if not (0 <= begin <= end <= len(buf) - base) or end - begin != count * np.dtype(dtype).itemsize:
            raise ValueError(f"tensor {name!r}: data_offsets {info['data_offsets']} do not fit its shape or the file")
        out[name] = np.frombuffer(buf, dtype=np.dtype(dtype).newbyteorder("<"), count=count,
                                  offset=base + begin).reshape(shape)
    return out


def read_checkpoint(path: str) -> Tuple[dict, dict, dict]:
    """(meta, model tensors, optimizer tensors) of the checkpoint at ``path``, verified (:func:`read_verified`)."""
    ckpt = read_verified(path)
    return ckpt.meta, ckpt.model_state, ckpt.opt_tensors


def _count(value, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def check_trainer_json(meta) -> None:
    """Raise ValueError (or KeyError) when ``trainer.json`` lacks a field a load reads or has one of the wrong type."""
    if not isinstance(meta, dict):
        raise ValueError(f"trainer.json holds a JSON {type(meta).__name__}, not an object")
    for key in ("optimizer_scalars", "lr_scheduler", "state", "callbacks", "rng_per_rank", "args", "world_size"):
        meta[key]  # noqa: B018 - presence check
    if not (isinstance(meta["callbacks"], dict) and isinstance(meta["rng_per_rank"], list)):
        raise ValueError("trainer.json has fields of the wrong type")
    check_meta(meta)


def check_meta(meta: dict) -> None:
    """Raise ValueError when the fields resume reads before loading have the wrong type (a damaged trainer.json)."""
    args, state, window = meta.get("args"), meta.get("state"), meta.get("loss_window")
    if not (isinstance(args, dict) and isinstance(state, dict) and _count(meta.get("world_size"), 1)
            and _count(args.get("per_device_train_batch_size"), 1) and _count(args.get("gradient_accumulation_steps"), 1)
            and _count(state.get("global_step", 0), 0) and all(_count(state.get(k, 0), 0) for k in ("max_steps", "steps_per_epoch"))
            and (meta.get("train_samples") is None or _count(meta.get("train_samples"), 1))
            and (meta.get("data_world_size") is None or _count(meta.get("data_world_size"), 1))
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
    if not isinstance(meta.get("data_fingerprint"), (dict, type(None))):
        raise ValueError("trainer.json has a data_fingerprint of the wrong type")
    if not contents.well_formed(meta.get(contents.RECORD)):
        raise ValueError(f"trainer.json has a {contents.RECORD} of the wrong type")


