"""Every runnable example in the docs runs as it is (see doc_examples.py for the convention).

Each chain runs in-process, in a fresh namespace and a temporary working directory, so
relative output_dirs land there. They train tiny models on the digits that ship with
scikit-learn: seconds each.
"""

from __future__ import annotations

import os

import pytest

from doc_examples import all_examples, examples, markdown_files

EXAMPLES = all_examples()


def test_the_convention_finds_the_examples():
    # the convention cannot silently stop matching: the tutorial and the how-to guides are found
    files = {e.path for e in EXAMPLES}
    assert os.path.join("docs", "getting-started.md") in files
    assert len(EXAMPLES) >= 8, [f"{e.path}:{e.line}" for e in EXAMPLES]


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"{e.path}:{e.line}" for e in EXAMPLES])
def test_example_runs(example, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = compile(example.code, os.path.join(os.path.abspath(os.sep), example.path), "exec")
    exec(code, {"__name__": "__main__"})


def test_a_continued_block_needs_a_block_before_it(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- runnable: continued -->\n```python\nx = 1\n```\n")
    with pytest.raises(AssertionError, match="no runnable block before it"):
        examples(str(page))


def test_markdown_files_include_every_docs_page():
    assert any(f.endswith(os.path.join("docs", "index.md")) for f in markdown_files())
