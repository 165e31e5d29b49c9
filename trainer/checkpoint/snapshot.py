"""What a checkpoint holds, copied to host memory at the step: :func:`snapshot` (a collective).

Rank-local state (RNG) of every rank is gathered to rank 0. When every rank holds the same tensors
(plain data parallel) the rest is taken from rank 0, which writes it alone; when the ranks hold
different tensors (sharding: each rank the optimizer states it owns, or slices), each rank copies
the tensors it writes into its own shard (``trainer.checkpoint.shards`` decides which). Optimizer
tensors are keyed by structured parameter names (``fc.weight``), not paddle's unique names, so a
checkpoint loads into a model built again.
"""

from __future__ import annotations

import json
import os
import time
from typing import Dict, Optional, Tuple

import numpy as np
import paddle

from .. import distributed as dist
from ..layout import adapters
from ..layout.stages import whole_names
from ..tensors import to_numpy
from . import contents
from .fingerprint import data_fingerprint
from .host_buffers import HostBuffers
from .manifest import FORMAT_VERSION
from .rng import rng_state
from .shards import digest, holdings, plan, shard_file, written_by


def _to_numpy(t: paddle.Tensor) -> np.ndarray:
    return to_numpy(t, keep_float16=True)  # numpy has no bfloat16: float32 holds every bfloat16 value exactly


def param_name_map(model: paddle.nn.Layer) -> Dict[str, str]:
    """paddle's unique parameter names (``linear_0.w_0``) -> structured names (``fc.weight``; a pipeline stage's
    under the whole model's names, ``trainer.layout.stages``)."""
    whole = whole_names(model)
    return {p.name: whole.get(name, name) for name, p in model.named_parameters()}


def _split_optimizer_state(opt_state: dict, names: Dict[str, str], convert=_to_numpy) -> Tuple[dict, dict]:
    """Tensors (renamed to structured names, passed through ``convert``) and JSON scalars of an optimizer state_dict."""
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
                tensors["master:" + names.get(raw, raw)] = convert(t)
        elif isinstance(value, paddle.Tensor):
            tensors[rename(key)] = convert(value)
        else:
            scalars[key] = value
    return tensors, scalars


def join_optimizer_state(tensors: dict, scalars: dict, names: Dict[str, str]) -> dict:
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



def snapshot(trainer, buffers: Optional[HostBuffers] = None) -> dict:
    """Copy everything a checkpoint holds to host memory (the only part that runs at the step).

    A collective: every rank must call it. Rank-local state (RNG) of every
    rank is gathered to rank 0. Returns what this rank writes: ``{}`` on ranks
    that write nothing (every rank but 0 when all hold the same state). ``buffers``: host memory kept
    from the last save to copy into (:class:`~trainer.checkpoint.host_buffers.HostBuffers`; released
    by the writer once the files are written); without it every tensor gets a new array.
    """
    def copy(key: str, value) -> np.ndarray:
        if not isinstance(value, paddle.Tensor):
            return np.asarray(value)
        return buffers.copy(key, value) if buffers is not None else _to_numpy(value)

    model, layout = trainer.model, trainer.layout
    names = {**param_name_map(model), **layout.slice_names(model)}  # with sharding stage 3's sliced parameters
    model_live = layout.whole_state(model)  # what this rank holds, under the whole model's names
    base = _frozen_base(trainer)
    if base is not None:  # a LoRA run: its frozen base is recorded, not saved (adapters.frozen_base)
        frozen = adapters.frozen_tensor_ids(model)
        model_live = {k: v for k, v in model_live.items() if id(v) not in frozen}
    opt_live, opt_scalars = _split_optimizer_state(trainer.optimizer.state_dict(), names, convert=lambda t: t)
    slices = layout.saved_blocks(model, model_live, opt_live)  # the pieces this rank holds of split tensors
    held = holdings(model_live, opt_live)
    ranks = _gather_json({"rng": rng_state(), "held": digest(held, slices), "cut": bool(slices), "pid": os.getpid(),
                          "token": time.time_ns()})
    loss_window = _loss_window(trainer)  # a collective too: the partial logging window, averaged over ranks
    sharded = len({r["held"] for r in ranks}) > 1 or any(r["cut"] for r in ranks)  # the same on every rank
    if sharded:  # one more collective: what every rank holds, to plan who writes what
        everything = _gather_json({"held": held, "slices": slices, "scalars": _plain(opt_scalars)})
        index = plan([e["held"] for e in everything], [e["slices"] for e in everything])
        for e in reversed(everything):  # scalars of every rank's optimizer; rank 0's where they differ
            opt_scalars.update(e["scalars"])
        rank = dist.get_rank()
        snap = {"shard": {"rank": rank, "world_size": len(ranks), "file": shard_file(rank, len(ranks)),
                          "writer_pid": ranks[0]["pid"], "token": ranks[0]["token"]},
                "tensors": {k: copy(k, (model_live if k.startswith("model/") else opt_live)[k.split("/", 1)[1]])
                            for k in written_by(index, rank)},
                "step": trainer.state.global_step, "run_id": trainer.state.run_id}
        if rank != 0:
            return snap
    elif not dist.is_main_process():
        return {}
    meta = _meta(trainer, opt_scalars, [r["rng"] for r in ranks], loss_window)
    meta["frozen_base"] = base
    meta["layout"] = {"world_size": trainer.world_size, "sharded": sharded,
                      **_plain(layout.describe())}
    if sharded:
        meta[contents.RECORD] = contents.record(*([k.split("/", 1)[1] for k in index if k.startswith(group + "/")]
                                                  for group in contents.GROUPS))
        snap.update(meta=meta, index=index)
        return snap
    meta[contents.RECORD] = contents.record(model_live, opt_live)  # what the files must hold (contents.py)
    return {
        "model": {k: copy("model/" + k, v) for k, v in model_live.items()},
        "optimizer": {k: copy("optimizer/" + k, v) for k, v in opt_live.items()},
        "meta": meta,
        "step": trainer.state.global_step,
        "run_id": trainer.state.run_id,
    }


def _meta(trainer, opt_scalars: dict, rank_states: list, loss_window: Optional[dict]) -> dict:
    """trainer.json: everything but the tensors."""
    scheduler = trainer.lr_scheduler.state_dict() if trainer.lr_scheduler is not None else None
    return {
        "format_version": FORMAT_VERSION,
        "optimizer_scalars": _plain(opt_scalars),
        "lr_scheduler": _plain(scheduler),
        "state": trainer.state.state_dict(),
        "callbacks": _plain(trainer.callbacks.state_dict()),
        "rng_per_rank": rank_states,
        "args": trainer.args.to_dict(),
        "world_size": trainer.world_size,
        # ranks that read different data (tensor/pipeline-parallel ranks of one group read the same): the global batch
        "data_world_size": trainer.layout.data_world_size,
        "train_samples": getattr(getattr(trainer, "_train_sampler", None), "dataset_len", None),
        "accumulation_adapted": bool(getattr(trainer, "accumulation_adapted", False)),  # trainer.resume_check
        "loss_window": loss_window,
        "identity": _plain(getattr(trainer, "run_identity", None) or {}),  # compared on resume (resume.py)
        "data_fingerprint": data_fingerprint(trainer.train_dataset, trainer.args.data_fingerprint),  # compared on resume (fingerprint.py)
        "adapter": adapters.describe(trainer.model),  # a LoRA model's rank, alpha, targets, counts; else None
    }


def _frozen_base(trainer) -> Optional[dict]:
    """What a checkpoint records of an adapter model's frozen base in place of its tensors (read by ``fit()``
    before the layout; here for a save outside it), or None: every tensor is saved. Sharding stage 3 holds the
    base in slices: saved whole there."""
    if not adapters.is_adapter(trainer.model) or trainer.layout.sharding_stage == 3:
        return None
    base = getattr(trainer, "frozen_base", None)
    return base if base is not None else adapters.frozen_base(trainer.model)


def _loss_window(trainer) -> Optional[dict]:
    """The loss summed since the last log record (mean over ranks) and the steps in it, so a resumed run logs
    the same value for the window that spans the interruption. One host read, at a save."""
    window = getattr(trainer, "_losses", None)
    if window is None or not window.steps:
        return None
    total = trainer.layout.share_loss(window.total())
    return {"sum": float(dist.all_reduce_mean(total)), "steps": int(window.steps)}


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
