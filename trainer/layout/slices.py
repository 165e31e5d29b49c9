"""Parameters that paddle's sharding stage 3 holds in slices: what a rank saves of them, what a resume gives them.

``GroupShardedStage3`` flattens every trainable parameter above its segment size, pads it to a multiple
of the sharding group's ranks, and keeps on each rank one contiguous range of it as ``param.fw_storage``
(the parameter itself holds no data between steps); the optimizer's states of that parameter are the
states of that range, named ``slice@<name>_...``. Smaller parameters stay whole on every rank.

:func:`split_parameters` finds them (from ``fw_storage``, the attribute paddle's own sharded state dict
reads), :func:`take_slices` turns a rank's state into the ranges it holds plus their places in the whole
tensor (``"flat": [start, stop]``, see ``trainer.checkpoint.shards``), and :func:`sliced_optimizer_state`
turns a whole optimizer state (a checkpoint of any layout) into the ranges this rank's stage 3 optimizer
asks for, so a resume onto stage 3 keeps every moment.
"""

from __future__ import annotations

from typing import Dict, NamedTuple

import numpy as np
import paddle


class Split(NamedTuple):
    param: object        # the parameter (its shape is the whole tensor's)
    storage: object      # paddle's fw_storage: this rank's range, padded
    start: int           # the range of the flattened parameter this rank holds: [start, stop)
    stop: int
    per_rank: int        # values each rank holds (with padding)
    numel: int


def _numel(t) -> int:
    return int(np.prod(t.shape)) if len(t.shape) else 1


def split_parameters(model: paddle.nn.Layer, rank: int) -> Dict[str, Split]:
    """``{structured name: Split}`` for the parameters paddle's stage 3 holds in slices on this rank; empty otherwise."""
    out = {}
    for name, param in model.named_parameters():
        storage = getattr(param, "fw_storage", None)
        if storage is None:
            continue
        per, numel = _numel(storage), _numel(param)
        start = rank * per
        out[name] = Split(param, storage, start, max(start, min(start + per, numel)), per, numel)
    return out


def take_slices(split: Dict[str, Split], model_state: dict, opt_state: dict) -> Dict[str, dict]:
    """Replace, in ``model_state`` and ``opt_state`` (structured keys, as the snapshot names them), each sliced
    parameter and its per-value optimizer states by the range this rank holds; return their slice specs.
    A rank whose range is only padding holds nothing of that parameter."""
    specs = {}
    for name, s in split.items():
        spec = {"shape": [int(d) for d in s.param.shape], "flat": [s.start, s.stop]}
        take = s.stop - s.start
        model_state.pop(name, None)
        if take:
            model_state[name] = s.storage.detach().reshape([-1])[:take]
            specs["model/" + name] = spec
        for key in [k for k in opt_state if k == "master:" + name or k.startswith("param:" + name + "_")]:
            value = opt_state[key]
            if _numel(value) != s.per_rank:
                continue  # the beta powers: one value, the same on every rank
            del opt_state[key]
            if take:
                opt_state[key] = value.detach().reshape([-1])[:take]
                specs["optimizer/" + key] = spec
    return specs


def sliced_optimizer_state(split: Dict[str, Split], state: dict) -> dict:
    """A whole optimizer state (paddle's raw names, as ``join_optimizer_state`` gives it) as stage 3 asks for it on
    this rank: each sliced parameter's states cut to this rank's padded range and named ``slice@...``."""
    out = dict(state)
    masters = dict(out.pop("master_weights", {}) or {})
    for s in split.values():
        raw = s.param.name
        for key in [k for k in list(out) if k.startswith(raw + "_")]:
            out["slice@" + key] = _cut(out.pop(key), s)
        if raw in masters:
            masters["slice@" + raw] = _cut(masters.pop(raw), s)
    if masters:
        out["master_weights"] = masters
    return out


def _cut(value, s: Split):
    if not isinstance(value, paddle.Tensor) or _numel(value) != s.numel:
        return value  # the beta powers
    flat = value.reshape([-1])
    part = flat[s.start:s.stop]
    pad = s.per_rank - (s.stop - s.start)
    return paddle.concat([part, paddle.zeros([pad], dtype=part.dtype)]) if pad else part


# ---- tensor parallel: fleet's parallel layers hold blocks of their weights ------------------------------------
def tensor_parallel_splits(model: paddle.nn.Layer) -> Dict[str, int]:
    """``{structured name: axis}`` of the parameters fleet's tensor-parallel layers split over the model-parallel
    group: paddle marks them ``is_distributed`` with their ``split_axis`` (ColumnParallelLinear's weight on axis 1
    and its bias on 0, RowParallelLinear's weight and VocabParallelEmbedding's table on axis 0)."""
    return {name: int(getattr(p, "split_axis", 0)) for name, p in model.named_parameters()
            if getattr(p, "is_distributed", False) and hasattr(p, "split_axis")}


def _state_keys_of(name: str, opt_state: dict) -> list:
    return [k for k in opt_state if k == "master:" + name or k.startswith("param:" + name + "_")]


def block_specs(splits: Dict[str, int], mp_rank: int, mp_degree: int, model_state: dict, opt_state: dict) -> Dict[str, dict]:
    """The slice specs (``"offsets"``, see ``trainer.checkpoint.shards``) of this rank's blocks of the split
    parameters and of their per-value optimizer states (the moments, the master weight: the parameter's shape)."""
    specs = {}
    for name, axis in splits.items():
        if name not in model_state:
            continue
        local = [int(d) for d in model_state[name].shape]
        full = list(local)
        full[axis] *= mp_degree
        offsets = [0] * len(local)
        offsets[axis] = mp_rank * local[axis]
        spec = {"shape": full, "offsets": offsets}
        specs["model/" + name] = spec
        for key in _state_keys_of(name, opt_state):
            if [int(d) for d in opt_state[key].shape] == local:
                specs["optimizer/" + key] = spec
    return specs


def local_blocks(splits: Dict[str, int], mp_rank: int, mp_degree: int, model_state: dict, opt_state: dict) -> None:
    """Cut, in place, the whole tensors of a checkpoint (numpy, any layout wrote them) to this rank's blocks of the
    split parameters and of their per-value optimizer states: what a tensor-parallel resume loads."""
    for name, axis in splits.items():
        if name not in model_state:
            continue
        full = list(model_state[name].shape)
        for state, keys in ((model_state, [name]), (opt_state, _state_keys_of(name, opt_state))):
            for key in keys:
                value = state[key]
                if list(value.shape) != full:
                    continue  # the beta powers: one value, the same on every rank
                if full[axis] % mp_degree:
                    raise ValueError(f"{name} has {full[axis]} rows on axis {axis}, which do not split over "
                                     f"tensor_parallel_degree={mp_degree}")
                size = full[axis] // mp_degree
                state[key] = np.take(value, range(mp_rank * size, (mp_rank + 1) * size), axis=axis)
