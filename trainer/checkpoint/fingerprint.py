"""The training data's fingerprint: recorded in each checkpoint, compared on resume.

A resumed run computes its position in the epoch (the sampler's index), so it is
exact only over the same samples in the same order. A changed sample count is
refused by :func:`trainer.checkpoint.resume.check_resume`; a change that keeps
the count (one image removed, another added) is what the fingerprint catches.

**The hook.** A training dataset may describe its content with ``fingerprint``:
a method (called on rank 0 at every save and on every rank when a run resumes:
make it cheap, or compute it once and keep it) or an attribute, whose value is a
string (a digest) or a dict of JSON values. A dict may hold mappings (name ->
value, e.g. ``{"files": {"a/x.jpg": 1234}}``): a resume then names the entries
removed, added or changed in the finest mapping that differs. The ImageFolder
datasets of ``models.resnet`` give the digest of their sorted relative paths with
sizes, a digest per class folder and, for small folders, the listing itself. A
dataset without the hook is checked by its length only.

On resume a changed fingerprint is a :class:`~trainer.errors.ConfigError` (exit 2)
of one line naming what changed; ``resume_allow_data_change=True`` resumes anyway,
on purpose (the checkpoints written from then on record the new fingerprint).

    >>> data_changes({"files": {"a/x.jpg": 10, "a/z.jpg": 5}}, {"files": {"a/y.jpg": 12, "a/z.jpg": 5}})
    'files: 1 removed (a/x.jpg), 1 added (a/y.jpg)'
"""

from __future__ import annotations

import json
from typing import Optional

from ..errors import DataError

#: The name of the hook (a method or an attribute of the training dataset).
HOOK = "fingerprint"
_SHOWN = 3  # entries named per kind of change


def data_fingerprint(dataset) -> Optional[dict]:
    """The dataset's fingerprint as a JSON-able dict (a string becomes ``{"digest": ...}``), or None
    when it has no ``fingerprint`` hook (a method, or a string or dict attribute). DataError (one line)
    when the method returns anything else, or a dict that is not JSON."""
    hook = getattr(dataset, HOOK, None)
    if hook is None or not (callable(hook) or isinstance(hook, (str, dict))):
        return None  # none, or an attribute of that name that is not ours (an array of chemical fingerprints)
    value = hook() if callable(hook) else hook
    if isinstance(value, str):
        value = {"digest": value}
    try:
        if not isinstance(value, dict):
            raise TypeError(f"a {type(value).__name__}")
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise DataError(f"the training dataset's {HOOK}() gave {exc}: return a string or a dict of JSON values "
                        "(docs/how-to/resume.md)") from None
    return value


def data_changes(old: dict, new: dict) -> Optional[str]:
    """What differs between two fingerprints, in one phrase; None when they are equal. Of the mappings that
    differ, the one with the most entries (the finest) is named; without one, the plain values that differ."""
    if old == new:
        return None
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    maps = [k for k in keys if isinstance(old.get(k), dict) and isinstance(new.get(k), dict)]
    if maps:
        key = max(maps, key=lambda k: len(set(old[k]) | set(new[k])))
        return f"{key}: {_mapping_changes(old[key], new[key])}"
    return "; ".join(f"{k} {_short(old.get(k))} then, {_short(new.get(k))} now" for k in keys[:_SHOWN])


def _mapping_changes(old: dict, new: dict) -> str:
    removed = [k for k in old if k not in new]
    added = [k for k in new if k not in old]
    changed = [k for k in old if k in new and old[k] != new[k]]
    parts = []
    for what, names in (("removed", removed), ("added", added)):
        if names:
            parts.append(f"{len(names)} {what} ({_names(names)})")
    if changed:
        shown = ", ".join(f"{k}: {_short(old[k])} -> {_short(new[k])}" for k in changed[:_SHOWN])
        parts.append(f"{len(changed)} changed ({shown}{', ...' if len(changed) > _SHOWN else ''})")
    return ", ".join(parts)


def _names(names) -> str:
    return ", ".join(map(str, names[:_SHOWN])) + (", ..." if len(names) > _SHOWN else "")


def _short(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
