"""The tensors a checkpoint must hold: its own record of them, and the check that its files hold every one.

Every save records in ``trainer.json`` the names of the tensors it writes (``tensor_names``: ``{"model": [...],
"optimizer": [...]}``; optimizer tensors keyed ``param:<structured parameter name>_<accumulator>`` or
``master:<name>``). A checkpoint whose files (a sharded checkpoint: its manifest's ``tensors`` index) lack one of
them is damaged: paddle's optimizer creates its accumulators lazily, at the first step, and a resumed one that
misses one stops there with an ``AssertionError``, so the names are checked when the checkpoint is verified,
before anything is built or trained (and ``ptrain inspect`` gives the same verdict).

Checkpoints written before the record existed are checked by the pattern of their own optimizer keys: every
parameter that has optimizer state has the same accumulators (AdamW: ``moment1_0``, ``moment2_0``,
``beta1_pow_acc_0``, ``beta2_pow_acc_0``), so a parameter with some of them and not all is missing the rest.
A parameter with none is not flagged (a parameter that got no gradient before the save has none, legitimately).
Numpy-free and paddle-free: ``ptrain inspect`` uses it.

    >>> missing({"tensor_names": {"model": ["w"], "optimizer": ["param:w_moment1_0"]}}, ["w"], [])
    ['optimizer/param:w_moment1_0']
    >>> missing({}, ["a", "b"], ["param:a_moment1_0", "param:a_moment2_0", "param:b_moment1_0"])
    ['optimizer/param:b_moment2_0']
"""

from __future__ import annotations

from collections.abc import Iterable

RECORD = "tensor_names"  # the key of trainer.json that holds the record
GROUPS = ("model", "optimizer")


def record(model_keys: Iterable[str], optimizer_keys: Iterable[str]) -> dict[str, list[str]]:
    """What a save writes in ``trainer.json`` under :data:`RECORD`."""
    return {"model": sorted(model_keys), "optimizer": sorted(optimizer_keys)}


def well_formed(value) -> bool:
    """Whether a ``trainer.json``'s record (absent: None) has the shape :func:`record` gives."""
    return value is None or (isinstance(value, dict) and all(
        isinstance(value.get(g), list) and all(isinstance(k, str) for k in value[g]) for g in GROUPS))


def missing(meta: dict, model_keys: Iterable[str], optimizer_keys: Iterable[str]) -> list[str]:
    """The tensors (``model/<name>``, ``optimizer/<key>``) ``meta``'s record names, or the accumulator pattern of
    an older checkpoint implies, that ``model_keys`` / ``optimizer_keys`` (what the files hold) lack; sorted."""
    model_keys, optimizer_keys = set(model_keys), set(optimizer_keys)
    recorded = meta.get(RECORD)
    if recorded is not None:
        return sorted([f"model/{k}" for k in set(recorded["model"]) - model_keys]
                      + [f"optimizer/{k}" for k in set(recorded["optimizer"]) - optimizer_keys])
    return [f"optimizer/{k}" for k in _unmatched_accumulators(model_keys, optimizer_keys)]


def _unmatched_accumulators(params: set, optimizer_keys: set) -> list[str]:
    """``param:<p>_<acc>`` keys that the other parameters' accumulators imply for ``p`` and that are absent."""
    by_length = sorted(params, key=len, reverse=True)
    held: dict[str, set] = {}
    for key in optimizer_keys:
        if not key.startswith("param:"):
            continue
        rest = key[len("param:"):]
        owner = next((p for p in by_length if rest.startswith(p + "_")), None)
        if owner is not None:
            held.setdefault(owner, set()).add(rest[len(owner) + 1:])
    every = set().union(*held.values()) if held else set()
    return sorted(f"param:{p}_{acc}" for p, accs in held.items() for acc in every - accs)


def describe_missing(names: list[str]) -> str:
    """``3 tensor(s): optimizer/param:0.weight_moment2_0, ...`` (the first five named)."""
    shown = ", ".join(names[:5]) + (f", ... ({len(names) - 5} more)" if len(names) > 5 else "")
    return f"{len(names)} tensor(s): {shown}"
