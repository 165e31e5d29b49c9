"""Print the migration table of PaddleNLP's TrainingArguments as Markdown:
``python -m trainer.compat.table`` (needs paddlenlp for the default values)."""

from __future__ import annotations

import dataclasses

from .fields_table import FIELDS

KIND_WORDS = {"same": "same", "default": "different default", "renamed": "renamed",
              "ignored": "accepted, **no effect** (a set value warns)",
              "unsupported": "accepted, **no effect**: not supported (a set value warns)"}


def markdown() -> str:
    from paddlenlp.trainer import TrainingArguments as PaddleNLPArguments

    from ..args import TrainingArguments

    ours = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    rows = ["| PaddleNLP field | PaddleNLP default | here | default here | notes |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(PaddleNLPArguments):
        kind, note = FIELDS.get(f.name, ("unsupported", "not in the table yet"))
        theirs = _default(f)
        mine = _default(ours[f.name]) if f.name in ours else "-"
        rows.append(f"| `{f.name}` | {theirs} | {KIND_WORDS[kind]} | {mine} | {note} |")
    return "\n".join(rows)


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
