"""MkDocs hook: reference tables generated from the code at build time, so they cannot go stale.

A page asks for a table with a marker line of its own, e.g. ``<!-- generated: training-arguments -->``;
:func:`on_page_markdown` replaces it. Everything here reads the code without importing paddle (the
``trainer`` modules used import only the standard library), so a build takes seconds and needs no
network. The same functions are imported by tests/docs/test_site.py.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def training_arguments_table(cls=None) -> str:
    """Every TrainingArguments field: name, type, default, meaning (its ``metadata['help']``)."""
    if cls is None:
        from trainer.args import TrainingArguments as cls

    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            default = "(required)"
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        meaning = f.metadata.get("help", "")
        rows.append(f"| <a id=\"{f.name}\"></a>`{f.name}` | `{_cell(kind)}` | `{_cell(repr(default))}` | {_cell(meaning)} |")
    return "\n".join(rows)


def trainer_state_table() -> str:
    """Every TrainerState field with its type, default and the comment beside it in trainer/state.py."""
    path = os.path.join(REPO, "trainer", "state.py")
    source = open(path, encoding="utf-8").read()
    lines = source.splitlines()
    cls = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == "TrainerState")
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            line = lines[node.lineno - 1]
            comment = line.split("#", 1)[1].strip() if "#" in line else ""
            default = ast.get_source_segment(source, node.value) if node.value is not None else ""
            kind = ast.get_source_segment(source, node.annotation)
            rows.append(f"| `{node.target.id}` | `{_cell(kind)}` | `{_cell(default)}` | {_cell(comment)} |")
    return "\n".join(rows)


def events_table() -> str:
    from trainer.events import event_table_markdown

    return event_table_markdown()


def _help_of(argv) -> str:
    """What ``ptrain ARGV`` prints (argparse help), at a fixed width."""
    from trainer.cli import commands

    out = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            commands.main(list(argv))
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return out.getvalue().rstrip()


def ptrain_commands() -> list:
    """The sub-commands ``ptrain --help`` lists (``{list,run,...}`` in its usage line)."""
    usage = _help_of(["--help"])
    match = re.search(r"\{([a-z,-]+)\}", usage)
    return match.group(1).split(",") if match else []


def ptrain_help() -> str:
    """``ptrain --help`` and every ``ptrain COMMAND --help``, verbatim."""
    parts = ["### `ptrain`", "", "```text", _help_of(["--help"]), "```"]
    for command in ptrain_commands():
        parts += ["", f"### `ptrain {command}`", "", "```text", _help_of([command, "--help"]), "```"]
    return "\n".join(parts)


def what_runs_where() -> str:
    """Which layouts and features run on GPUs and on a CPU build (trainer/capabilities.py)."""
    from trainer.capabilities import where_it_runs

    return where_it_runs()


GENERATORS = {
    "training-arguments": training_arguments_table,
    "trainer-state": trainer_state_table,
    "events": events_table,
    "ptrain-help": ptrain_help,
    "what-runs-where": what_runs_where,
}


def expand(markdown: str) -> str:
    def replace(match):
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated section {name!r}: one of {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown, page, config, files, **kwargs):  # MkDocs hook
    return expand(markdown)


_SPHINX_ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data):(?=<code>)")
_LITERAL_MARK = re.compile(r"(\w)::</p>")


def on_page_content(html, page, config, files, **kwargs):  # MkDocs hook
    """Docstrings use reST roles (``:class:`X```) and ``Example::``; show them as plain code and a colon."""
    return _LITERAL_MARK.sub(r"\1:</p>", _SPHINX_ROLE.sub("", html))
