"""The shell commands the docs show (tests/docs/test_doc_commands.py runs them).

A documented command is a line of a fenced ``bash``/``sh``/``shell``/``console`` block of the README or
of a page under ``docs/`` (a ``\\`` continues a line; ``# ...`` comments and a ``$ `` prompt are dropped),
cut at ``&&`` into its commands, of which those starting with ``ptrain``, ``srun ptrain`` or
``python -m benchmarks`` are kept (``pip install`` and other shell steps are the reader's set-up). A
trailing ``&`` (run in the background) is dropped: the test knows which commands are servers.

    >>> split_line('ptrain run digits && ptrain predict digits --model m x.png   # then predict')
    ['ptrain run digits', 'ptrain predict digits --model m x.png']
    >>> split_line('pip install -e ".[cpu]" && ptrain run digits')
    ['ptrain run digits']
    >>> split_line('ptrain serve runs/x/inference &            # "ready on ..."')
    ['ptrain serve runs/x/inference']
"""

from __future__ import annotations

import glob
import os
import re
from typing import List, NamedTuple

from helpers import REPO

FENCE = re.compile(r"^```(?:bash|sh|shell|console)[ \t]*\n(.*?)^```", re.M | re.S)
KEPT = ("ptrain ", "srun ptrain ", "python -m benchmarks")


class Command(NamedTuple):
    path: str   # relative to the repository
    line: int   # the line where the command starts
    text: str   # the command as written, comment and background '&' dropped, spaces collapsed

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def split_line(line: str) -> List[str]:
    """The kept commands of one shell line."""
    line = re.sub(r"(^|\s)#.*$", "", line).strip()  # a comment (no '#' inside the documented values)
    line = re.sub(r"^\$\s+", "", line)
    out = []
    for part in line.split("&&"):
        part = " ".join(part.split())
        part = re.sub(r"\s*&$", "", part)
        if part.startswith(KEPT) or part in ("ptrain", "python -m benchmarks"):
            out.append(part)
    return out


def page_commands(path: str) -> List[Command]:
    text = open(path, encoding="utf-8").read()
    rel = os.path.relpath(path, REPO)
    found: List[Command] = []
    for m in FENCE.finditer(text):
        first = text.count("\n", 0, m.start()) + 2  # the block's first line
        pending, start = "", 0
        for i, raw in enumerate(m.group(1).splitlines()):
            if not pending:
                start = first + i
            if raw.rstrip().endswith("\\"):
                pending += raw.rstrip()[:-1] + " "
                continue
            found += [Command(rel, start, c) for c in split_line(pending + raw)]
            pending = ""
    return found


def markdown_pages() -> List[str]:
    return [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))


def documented_commands() -> List[Command]:
    return [c for page in markdown_pages() for c in page_commands(page)]
