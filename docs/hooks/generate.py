"""Reference tables generated from the code, so they cannot go stale.

A page asks for a table with a marker line of its own, e.g. ``<!-- generated: training-arguments -->``. Where the
marker is followed by the table and ``<!-- end of generated -->``, the table is kept in the Markdown itself (readable
where the Markdown is read: a clone, GitHub); ``python docs/hooks/generate.py`` writes those tables anew and
tests/docs/test_site.py fails when one differs from the code. A lone marker (``ptrain-help``: argparse's layout
varies with the Python version) is filled at build time only. As an MkDocs hook, :func:`on_page_markdown` fills
every table when the site builds. Everything here reads the code without importing paddle (the ``trainer`` modules
used import only the standard library), so a build takes seconds and needs no network.
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

END = "<!-- end of generated -->"
# a marker alone, or a marker, the table kept in the Markdown and the end line
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$(\n.*?^<!-- end of generated -->$)?", re.M | re.S)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _annotation(cls, f) -> str:
    """A field's type as written in its class (``List[str]``). Not ``f.type``: argument parsers (PaddleNLP's and
    Hugging Face's ``HfArgumentParser``) replace a Field's ``type`` with the resolved object in place."""
    for klass in cls.__mro__:
        written = vars(klass).get("__annotations__", {}).get(f.name)
        if written is not None:
            return written if isinstance(written, str) else typing_name(written)
    return typing_name(f.type)


def typing_name(kind) -> str:
    if isinstance(kind, str):
        return kind
    if getattr(kind, "__args__", None):
        return str(kind).replace("typing.", "")
    return getattr(kind, "__name__", str(kind))


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
        kind = _annotation(cls, f)
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


def paddleformers_arguments() -> str:
    """PaddleFormers' TrainingArguments field by field (trainer/args/paddleformers_fields.py), with its counts; its
    defaults are stored in trainer/compat/table.py, so this runs without paddleformers."""
    from trainer.compat.table import paddleformers_counts_line, paddleformers_markdown

    return paddleformers_counts_line() + "\n\n" + paddleformers_markdown()


GENERATORS = {
    "training-arguments": training_arguments_table,
    "trainer-state": trainer_state_table,
    "events": events_table,
    "ptrain-help": ptrain_help,
    "what-runs-where": what_runs_where,
    "paddleformers-arguments": paddleformers_arguments,
}


def expand(markdown: str, kept_only: bool = False) -> str:
    """Every table of ``markdown`` as the code gives it now; ``kept_only``: only the tables kept in the Markdown
    (with their markers, as they are committed), lone markers left as they are."""
    def replace(match):
        name, kept = match.group(1), match.group(2) is not None
        if name not in GENERATORS:
            raise ValueError(f"unknown generated section {name!r}: one of {', '.join(GENERATORS)}")
        if kept_only:
            return f"<!-- generated: {name} -->\n{GENERATORS[name]()}\n{END}" if kept else match.group(0)
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)


def pages_with_tables() -> list:
    """The Markdown files under docs/ that hold a generated table."""
    docs = os.path.join(REPO, "docs")
    return sorted(os.path.join(folder, name) for folder, _, names in os.walk(docs) for name in names
                  if name.endswith(".md") and MARKER.search(open(os.path.join(folder, name), encoding="utf-8").read()))


def write_kept_tables() -> list:
    """Rewrite the tables kept in the Markdown from the code; the pages that changed."""
    changed = []
    for path in pages_with_tables():
        text = open(path, encoding="utf-8").read()
        fresh = expand(text, kept_only=True)
        if fresh != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(fresh)
            changed.append(os.path.relpath(path, REPO))
    return changed


def on_page_markdown(markdown, page, config, files, **kwargs):  # MkDocs hook
    return expand(markdown)


_SPHINX_ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data):(?=<code>)")
_LITERAL_MARK = re.compile(r"(\w)::</p>")


def on_page_content(html, page, config, files, **kwargs):  # MkDocs hook
    """Docstrings use reST roles (``:class:`X```) and ``Example::``; show them as plain code and a colon."""
    return _LITERAL_MARK.sub(r"\1:</p>", _SPHINX_ROLE.sub("", html))


if __name__ == "__main__":  # python docs/hooks/generate.py: the tables kept in the Markdown, written anew
    for page in write_kept_tables():
        print(f"wrote {page}")
