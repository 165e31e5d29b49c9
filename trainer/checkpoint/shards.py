"""The sharded checkpoint format: which rank writes which tensor, and the index that puts them together again.

A layout whose ranks hold different state (sharding stage 1/2: each rank the optimizer states of the
parameters it owns; stage 3, tensor and pipeline parallel: slices of tensors) writes one file per rank,
``shard-RRRRR-of-WWWWW.safetensors``, all at the same time, under one manifest (format version 2). A layout
whose ranks all hold the same state (plain data parallel) keeps the single-writer format 1. Which of the two
is decided from what the ranks hold (:func:`holdings`, compared through :func:`digest`), never from a
layout's name, so any layout that shards state is saved whole.

The manifest's ``tensors`` index gives, for every tensor of the model (``model/<name>``) and of the optimizer
(``optimizer/<key>``), its full shape and dtype and its parts: ``{"file", "rank", "key"}`` for a whole tensor
(a replicated one is written by one rank, the owner of an optimizer state by its owner), plus ``"flat":
[start, stop]`` for a range of the flattened tensor (sharding stage 3) or ``"offsets"`` (one per dimension)
for a block of it (tensor parallel cuts tensors along an axis). ``trainer.layout.slices`` gives the slices
(``{"model/<name>": {"shape": full, "flat": [a, b]} or {"shape": full, "offsets": [...]}}``, only for the
tensors a layout cuts); everything else is a whole tensor (a pipeline stage holds whole tensors the other
stages do not).

:func:`plan` decides the writers (the same answer on every rank, from every rank's holdings); :func:`assemble`
rebuilds whole tensors from the parts and refuses parts that do not cover a tensor exactly once, so a
checkpoint is loaded whole or not at all. Numpy only: ``ptrain inspect`` reads this without paddle.

    >>> index = plan([{"model/w": ([2, 2], "float32")}, {"model/w": ([2, 2], "float32")}], [{}, {}])
    >>> index["model/w"]["parts"]
    [{'rank': 0, 'file': 'shard-00000-of-00002.safetensors', 'key': 'model/w'}]
"""

from __future__ import annotations

import hashlib
import json
from typing import Callable, Dict, List, Tuple

import numpy as np

SHARDED_FORMAT_VERSION = 2
GROUPS = ("model", "optimizer")


def shard_file(rank: int, world_size: int) -> str:
    return f"shard-{rank:05d}-of-{world_size:05d}.safetensors"


def holdings(model: Dict[str, object], optimizer: Dict[str, object]) -> Dict[str, Tuple[list, str]]:
    """``{"model/<name>" | "optimizer/<key>": (shape, dtype)}`` of what this rank holds (arrays or tensors)."""
    out = {}
    for group, tensors in zip(GROUPS, (model, optimizer)):
        for key, t in tensors.items():
            out[f"{group}/{key}"] = ([int(d) for d in t.shape], str(t.dtype).replace("paddle.", ""))
    return out


def digest(held: dict, slices: dict) -> str:
    """A short fingerprint of what a rank holds: equal on every rank means the ranks hold the same state."""
    text = json.dumps([sorted(held.items()), sorted(slices.items())], sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def plan(held_per_rank: List[dict], slices_per_rank: List[dict]) -> Dict[str, dict]:
    """The index of a sharded checkpoint: for every tensor any rank holds, its full shape, dtype and parts.

    A whole tensor that several ranks hold (replicated, or an optimizer state that every data-parallel
    replica of its owner holds) is written by one of them, the one with the fewest values to write so far
    (what only some ranks hold placed first, then the biggest first), so the writing is spread over the ranks. A slice is written by
    the first rank that holds it. ValueError when ranks hold one tensor with different shapes and the
    layout gives no slices for it.
    """
    world = len(held_per_rank)
    keys = sorted({k for held in held_per_rank for k in held})
    load = [0] * world

    def numel(shape) -> int:
        return int(np.prod(shape)) if shape else 1

    holders_of = {k: [r for r in range(world) if k in held_per_rank[r]] for k in keys}
    # what only some ranks can write first (owned states, slices), then the rest, biggest first, to even the load
    order = sorted(keys, key=lambda k: (len(holders_of[k]) == world and not any(k in s for s in slices_per_rank),
                                        -max(numel(held_per_rank[r][k][0]) for r in holders_of[k]), k))
    index: Dict[str, dict] = {}
    for key in order:
        holders = holders_of[key]
        cut = [r for r in holders if key in slices_per_rank[r]]
        dtype = held_per_rank[holders[0]][key][1]
        if cut:
            shape = list(slices_per_rank[cut[0]][key]["shape"])
            parts, seen = [], set()
            for r in cut:
                spec = slices_per_rank[r][key]
                where = json.dumps({k: spec[k] for k in ("flat", "offsets") if k in spec}, sort_keys=True)
                if where in seen:
                    continue  # the same slice on another data-parallel replica: written once
                seen.add(where)
                parts.append({"rank": r, "file": shard_file(r, world), "key": key,
                              **{k: [int(v) for v in spec[k]] for k in ("flat", "offsets") if k in spec}})
                load[r] += numel(held_per_rank[r][key][0])
            index[key] = {"shape": shape, "dtype": dtype, "parts": parts}
            continue
        shapes = {tuple(held_per_rank[r][key][0]) for r in holders}
        if len(shapes) > 1:
            raise ValueError(f"ranks hold {key} with different shapes {sorted(shapes)} and the layout gives no slices "
                             "for it (trainer.layout.slices)")
        writer = min(holders, key=lambda r: (load[r], r))
        shape = list(held_per_rank[writer][key][0])
        load[writer] += numel(shape)
        index[key] = {"shape": shape, "dtype": dtype, "parts": [{"rank": writer, "file": shard_file(writer, world),
                                                                 "key": key}]}
    return {k: index[k] for k in keys}


def written_by(index: Dict[str, dict], rank: int) -> List[str]:
    """The tensors ``rank`` writes (keys of its shard file)."""
    return [k for k, entry in index.items() if any(p["rank"] == rank for p in entry["parts"])]


def files_of(index: Dict[str, dict], keys=None) -> List[str]:
    """The shard files that hold ``keys`` (every tensor when None), in rank order."""
    wanted = index if keys is None else {k: index[k] for k in keys if k in index}
    return sorted({p["file"] for entry in wanted.values() for p in entry["parts"]})


def check_index(index) -> None:
    """ValueError when the manifest's ``tensors`` index is malformed (a damaged manifest)."""
    if not isinstance(index, dict) or not index:
        raise ValueError("the manifest lists no tensors")
    for key, entry in index.items():
        if not (isinstance(key, str) and key.split("/", 1)[0] in GROUPS and isinstance(entry, dict)
                and isinstance(entry.get("shape"), list) and isinstance(entry.get("parts"), list) and entry["parts"]
                and all(isinstance(p, dict) and isinstance(p.get("file"), str) and isinstance(p.get("key"), str)
                        and isinstance(p.get("rank"), int) for p in entry["parts"])):
            raise ValueError(f"the manifest's entry for {key!r} is malformed")


def assemble(index: Dict[str, dict], load_file: Callable[[str], Dict[str, np.ndarray]],
             keys=None) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]:
    """(model tensors, optimizer tensors) rebuilt whole from their parts; only the files that hold ``keys``
    (every tensor when None) are read, each once, through ``load_file(name) -> {key: array}``.

    ValueError naming the tensor, the file and the rank when a part is missing, has the wrong shape, or
    the parts do not cover the tensor exactly once.
    """
    wanted = sorted(index) if keys is None else [k for k in keys if k in index]
    loaded: Dict[str, Dict[str, np.ndarray]] = {}

    def part_array(part: dict) -> np.ndarray:
        name = part["file"]
        if name not in loaded:
            loaded[name] = load_file(name)
        found = loaded[name].get(part["key"])
        if found is None:
            raise ValueError(f"{name} (rank {part['rank']}) lacks tensor {part['key']}")
        return found

    out = {group: {} for group in GROUPS}
    for key in wanted:
        entry = index[key]
        group, name = key.split("/", 1)
        shape = [int(d) for d in entry["shape"]]
        parts = entry["parts"]
        if len(parts) == 1 and "flat" not in parts[0] and "offsets" not in parts[0]:
            array = part_array(parts[0])
            if list(array.shape) != shape:
                raise ValueError(f"{parts[0]['file']} (rank {parts[0]['rank']}) holds {key} with shape "
                                 f"{list(array.shape)}, the manifest says {shape}")
            out[group][name] = array
            continue
        out[group][name] = _put_together(key, shape, parts, part_array)
    return out["model"], out["optimizer"]


def _put_together(key: str, shape: list, parts: list, part_array) -> np.ndarray:
    first = part_array(parts[0])
    full = np.empty(shape, dtype=first.dtype)
    covered = np.zeros(shape, dtype=np.uint8)
    flat, flat_covered = full.reshape(-1), covered.reshape(-1)
    for part in parts:
        array = part_array(part)
        where = f"{part['file']} (rank {part['rank']})"
        if "flat" in part:
            start, stop = (int(v) for v in part["flat"])
            if not (0 <= start <= stop <= flat.size) or array.size != stop - start:
                raise ValueError(f"{where} holds {array.size} values of {key} for range [{start}, {stop}) of "
                                 f"{flat.size}")
            flat[start:stop] = array.reshape(-1)
            flat_covered[start:stop] += 1
        elif "offsets" in part:
            offsets = [int(v) for v in part["offsets"]]
            if len(offsets) != len(shape) or array.ndim != len(shape) or any(
                    o < 0 or o + n > s for o, n, s in zip(offsets, array.shape, shape)):
                raise ValueError(f"{where} holds a block {list(array.shape)} of {key} at {offsets} outside {shape}")
            box = tuple(slice(o, o + n) for o, n in zip(offsets, array.shape))
            full[box] = array
            covered[box] += 1
        else:
            raise ValueError(f"{where} holds a whole {key} beside other parts of it")
    if flat_covered.size and not (flat_covered == 1).all():
        gap = int((flat_covered == 0).sum())
        raise ValueError(f"the parts of {key} cover {gap} of its {flat.size} values no time and "
                         f"{int((flat_covered > 1).sum())} more than once")
    return full
