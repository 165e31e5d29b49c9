"""What a new user's first hour with the docs ran into, each checked against the files the site is built from.

- the exit-codes table broke words mid-word in the built site ("ConfigErro|r", "--|max_restarts"): every code
  span in any table cell, headers included, is kept whole by docs/stylesheets/extra.css;
- ``mkdocs serve`` suggested ``ptrain serve``'s port (8000): mkdocs.yml's ``dev_addr`` is another, and the
  docs say the same address;
- serve.md named the extra ``ptrain serve`` needs only after its commands, in other words than the code's hint:
  the first paragraph says it, with the command the code prints;
- the benchmarks page gave three overhead figures for the same workload: its prose gives one.
"""

import os
import re

import yaml
from helpers import REPO

from trainer.cli.serve import SERVE_EXTRA


def _read(*parts):
    with open(os.path.join(REPO, *parts), encoding="utf-8") as f:
        return f.read()


def test_code_in_any_table_cell_is_never_broken_mid_word():
    css = _read("docs", "stylesheets", "extra.css")
    rules = re.findall(r"([^{}]+)\{([^}]*)\}", re.sub(r"/\*.*?\*/", "", css, flags=re.S))
    whole = [sel for sel, body in rules if "white-space: nowrap" in body and "overflow-wrap: normal" in body]
    selectors = {s.strip() for sel in whole for s in sel.split(",")}
    assert {".md-typeset table:not([class]) th code", ".md-typeset table:not([class]) td code"} <= selectors
    table = _read("docs", "reference", "exit-codes.md")
    assert "`ConfigError`" in table and "`--max_restarts`" in table  # the spans the rule keeps whole
    assert "stylesheets/extra.css" in _read("mkdocs.yml")


def test_mkdocs_serve_does_not_take_ptrain_serves_port():
    config = yaml.safe_load(re.sub(r"!!python/\S+", "", _read("mkdocs.yml")))
    host, port = config["dev_addr"].rsplit(":", 1)
    from trainer.deploy.server import ServeConfig

    assert int(port) != ServeConfig("x").port
    assert f"http://{host}:{port}" in _read("docs", "index.md")


def test_serve_md_names_the_extra_first_in_the_codes_words():
    page = _read("docs", "how-to", "serve.md")
    first_block = page.index("```")
    assert 'pip install -e ".[serve]"' in page[:first_block]
    assert SERVE_EXTRA.split(" in ")[0] in page[:first_block].replace("`", "")


def test_the_benchmarks_page_gives_one_overhead_figure():
    prose = _read("docs", "explanation", "benchmarks.md").split("--8<--")[0]
    figures = set(re.findall(r"\*?\*?(\d\.\d+)\*?\*? of the bare loop's throughput", prose))
    assert figures == {"0.968"}, figures
