"""Print the migration table of PaddleNLP's TrainingArguments as Markdown:
``python -m trainer.compat.table`` (needs paddlenlp for the default values)."""

from __future__ import annotations

import dataclasses
import typing

from ..args import TrainingArguments
from ..args.fields_table import FIELDS

KIND_WORDS = {"same": "same", "default": "different default", "renamed": "renamed",
              "ignored": "accepted, **no effect** (a set value warns)",
              "unsupported": "accepted, **no effect**: not supported (a set value warns)"}


def markdown() -> str:
    from paddlenlp.trainer import TrainingArguments as PaddleNLPArguments

    ours = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    hints_theirs, hints_ours = typing.get_type_hints(PaddleNLPArguments), typing.get_type_hints(TrainingArguments)
    rows = ["| PaddleNLP field | PaddleNLP default | here | default here | type here, where it differs | notes |",
            "|---|---|---|---|---|---|"]
    for f in dataclasses.fields(PaddleNLPArguments):
        kind, note = FIELDS.get(f.name, ("unsupported", "not in the table yet"))
        theirs = _default(f)
        mine = _default(ours[f.name]) if f.name in ours else "-"
        types = ""
        if f.name in ours and type_name(hints_ours[f.name]) != type_name(hints_theirs[f.name]):
            types = f"`{type_name(hints_ours[f.name])}` (PaddleNLP: `{type_name(hints_theirs[f.name])}`)"
        rows.append(f"| `{f.name}` | {theirs} | {KIND_WORDS[kind]} | {mine} | {types} | {note} |")
    return "\n".join(rows)


def type_name(hint) -> str:
    """``Optional[bool]``, ``str``, ``IntervalStrategy``: a field's type as the table shows it."""
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "required"
    text = repr(getattr(value, "value", value))
    return f"`{text}`".replace("|", "\\|")


if __name__ == "__main__":
    print(markdown())
