"""The runnable code examples of the docs (and the README: tests/test_readme.py).

Convention: a fenced ```python block whose preceding line is ``<!-- runnable -->`` is a
complete example; ``<!-- runnable: continued -->`` continues the previous runnable block of
the same file (a tutorial split by prose runs as one program). Every other block is a
fragment and is not run.
"""

from __future__ import annotations

import glob
import os
import re
from typing import List, NamedTuple

from helpers import REPO

MARK = re.compile(r"^<!-- runnable(: continued)? -->\n```python\n(.*?)^```", re.M | re.S)


class Example(NamedTuple):
    path: str       # relative to the repository
    line: int       # line of the first block
    code: str       # the blocks of the chain, joined


def markdown_files() -> List[str]:
    """The docs pages (the README's example runs as a script in tests/test_readme.py)."""
    return sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))


def examples(path: str) -> List[Example]:
    text = open(path, encoding="utf-8").read()
    rel = os.path.relpath(path, REPO)
    chains: List[Example] = []
    for m in MARK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        if m.group(1) and chains:
            prev = chains[-1]
            # pad with blank lines so a traceback's line numbers point into the Markdown file
            gap = line + 2 - (prev.line + 1 + prev.code.count("\n"))
            chains[-1] = prev._replace(code=prev.code + "\n" * max(gap, 1) + m.group(2))
        elif m.group(1):
            raise AssertionError(f"{rel}:{line}: 'runnable: continued' with no runnable block before it")
        else:
            chains.append(Example(rel, line, "\n" * (line + 1) + m.group(2)))
    return chains


def all_examples() -> List[Example]:
    return [e for f in markdown_files() for e in examples(f)]
