"""The documentation site builds with ``mkdocs build --strict`` (offline), and its generated
reference pages hold everything the code has: every TrainingArguments field with its default,
every event, every ptrain command, every callback, every public Trainer method."""

from __future__ import annotations

import dataclasses
import html
import importlib.util
import os
import re
import subprocess
import sys
import time

import pytest

from helpers import REPO

# found, not imported (the handler takes ~0.5 s to import, in every worker that collects the suite)
from patience import patience
DOCS_PACKAGES = ("mkdocs", "mkdocstrings_handlers", "material")
pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in DOCS_PACKAGES),
                                reason="the docs extra is not installed: pip install -e '.[docs]'")


def _load_hook():
    spec = importlib.util.spec_from_file_location("docs_generate", os.path.join(REPO, "docs", "hooks", "generate.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _load_hook()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=REPO)
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=patience(600))
    assert result.returncode == 0, result.stderr[-5000:]
    print(f"mkdocs build --strict: {time.monotonic() - start:.1f} s")
    return out


def _page(site, name):
    with open(os.path.join(site, name, "index.html"), encoding="utf-8") as f:
        return f.read()


def _text(page_html):
    return html.unescape(re.sub(r"<[^>]+>", "", page_html))


def test_the_site_builds_strict_and_offline(site):
    assert os.path.isfile(os.path.join(site, "index.html"))
    assert os.path.isfile(os.path.join(site, "search", "search_index.json"))


def test_every_training_argument_is_in_the_reference_with_type_and_default(site):
    from trainer import TrainingArguments

    page = _page(site, "reference/training-arguments")
    for f in dataclasses.fields(TrainingArguments):
        declared = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        assert f'id="{f.name}"' in page, f.name
        # the row holds the type, the default and the help text the code has today
        cells = re.search(rf'id="{f.name}"></a><code>{f.name}</code></td>\s*<td><code>(.*?)</code></td>\s*'
                          rf"<td><code>(.*?)</code></td>\s*<td>(.*?)</td>", page, re.S)
        assert cells, f.name
        assert html.unescape(cells.group(2)) == repr(declared), f.name  # as declared (device 'auto' is resolved later)
        assert html.unescape(re.sub(r"<[^>]+>", "", cells.group(3))) == f.metadata["help"], f.name


def test_the_arguments_table_follows_the_dataclass():
    # a field added to the dataclass appears without touching the docs
    from trainer import TrainingArguments

    @dataclasses.dataclass
    class WithExtra(TrainingArguments):
        brand_new_option: int = dataclasses.field(default=7, metadata={"help": "a field the docs never mention"})

    table = generate.training_arguments_table(WithExtra)
    assert "`brand_new_option` | `int` | `7` | a field the docs never mention |" in table


def test_the_arguments_table_is_the_same_after_an_argument_parser_has_read_the_dataclass():
    """PaddleNLP's PdArgumentParser (as Hugging Face's HfArgumentParser) replaces each Field's ``type`` with the
    resolved object in place: ``List[str]`` became ``List`` in the table when a test of the same process had parsed
    TrainingArguments before (CI, stop 45). The table reads the annotations as written in the class."""
    from paddlenlp.trainer import PdArgumentParser

    from trainer import TrainingArguments

    before = generate.training_arguments_table(TrainingArguments)
    PdArgumentParser(TrainingArguments)
    assert not isinstance(dataclasses.fields(TrainingArguments)[0].type, str)  # the parser did change the fields
    assert generate.training_arguments_table(TrainingArguments) == before
    assert "`report_to` | `List[str]` |" in before


def test_the_tables_kept_in_the_markdown_are_the_codes():
    """A table kept in a page's Markdown (between its marker and ``<!-- end of generated -->``) is what the code
    gives now: a field, event or layout added without running ``python docs/hooks/generate.py`` fails here."""
    pages = generate.pages_with_tables()
    assert len(pages) >= 5
    stale = [os.path.relpath(p, REPO) for p in pages
             if generate.expand(open(p, encoding="utf-8").read(), kept_only=True) != open(p, encoding="utf-8").read()]
    assert not stale, f"stale generated tables in {stale}: run python docs/hooks/generate.py"
    kept = "<!-- generated: events -->\nold\n<!-- end of generated -->\n"
    assert generate.expand(kept, kept_only=True) != kept and "| `on_fit_begin`" in generate.expand(kept, kept_only=True)


def test_the_paddleformers_table_prints_without_paddleformers_and_is_the_pages():
    """docs/how-to/migrate-paddleformers.md keeps PaddleFormers' field table, generated where paddleformers is not
    installed (here) from the table module and the defaults stored beside it: ``python -m trainer.compat.table
    paddleformers``, as the page shows it, prints the rows the page holds, one per field, none missing from the
    table, without importing paddleformers or paddle."""
    from trainer.args.paddleformers_fields import FIELDS
    from trainer.compat.table import PADDLEFORMERS_DEFAULTS

    code = ("import runpy, sys; sys.argv = ['table', 'paddleformers']; runpy.run_module('trainer.compat.table', "
            "run_name='__main__'); print('IMPORTED', 'paddle' in sys.modules, 'paddleformers' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=patience(120), env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed, imported = proc.stdout.rstrip().rsplit("\n", 1)
    assert imported == "IMPORTED False False"
    page = open(os.path.join(REPO, "docs", "how-to", "migrate-paddleformers.md"), encoding="utf-8").read()
    assert "python -m trainer.compat.table paddleformers" in page and printed in page
    rows = [r for r in printed.splitlines()[2:]]
    assert len(rows) == len(PADDLEFORMERS_DEFAULTS) == len(FIELDS) == 236
    assert set(PADDLEFORMERS_DEFAULTS) == set(FIELDS) and "not in the table yet" not in printed


def test_the_documented_regeneration_command_rewrites_a_stale_table(tmp_path):
    """``python docs/hooks/generate.py`` as docs/how-to/migrate-paddleformers.md shows it, in a copy of the docs
    and the code: nothing to write while the tables are the code's; a stale PaddleFormers table is written anew."""
    import shutil

    for folder in ("docs", "trainer", "callbacks"):
        shutil.copytree(os.path.join(REPO, folder), tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    page = tmp_path / "docs" / "how-to" / "migrate-paddleformers.md"
    fresh = page.read_text(encoding="utf-8")

    def run():
        proc = subprocess.run([sys.executable, "docs/hooks/generate.py"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=patience(120), env=dict(os.environ, PYTHONPATH=str(tmp_path)))
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    assert run() == ""
    page.write_text(fresh.replace("| `sharding` | `'stage1'` |", "| `sharding` | `''` |"), encoding="utf-8")
    assert page.read_text(encoding="utf-8") != fresh
    assert run().strip() == "wrote docs/how-to/migrate-paddleformers.md"
    assert page.read_text(encoding="utf-8") == fresh


def test_an_unknown_generated_section_fails_the_build():
    with pytest.raises(ValueError, match="unknown generated section 'nope'"):
        generate.expand("<!-- generated: nope -->")


def test_every_event_is_in_the_events_reference(site):
    from trainer.events import EVENT_TABLE, Event

    text = _text(_page(site, "reference/events"))
    for event in Event:
        when, mutable = EVENT_TABLE[event]
        assert f"on_{event.value}" in text and when in text, event


def test_every_trainer_state_field_is_in_the_reference(site):
    from trainer import TrainerState

    page = _page(site, "reference/state")
    for f in dataclasses.fields(TrainerState):
        assert f"<code>{f.name}</code>" in page, f.name


def test_every_ptrain_command_and_option_is_in_the_reference(site):
    commands = generate.ptrain_commands()
    assert {"run", "list", "inspect", "predict", "verify-resume"} <= set(commands)
    text = _text(_page(site, "reference/cli"))
    for command in commands:
        assert f"ptrain {command}" in text, command
        for option in re.findall(r"(?<![\w-])--[a-z][a-z_-]+", generate._help_of([command, "--help"])):
            assert option in text, (command, option)


def test_every_public_trainer_method_is_documented(site):
    from trainer import Trainer

    page = _page(site, "reference/trainer")
    public = [n for n, v in vars(Trainer).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))]
    assert {"fit", "evaluate", "predict", "export", "save_checkpoint", "load_checkpoint", "compute_loss"} <= set(public)
    for name in public:
        assert f'id="trainer.trainer.Trainer.{name}"' in page, name
    assert ":::" not in _text(page)  # the mkdocstrings directives were rendered, not left as text


def test_every_callback_is_documented_with_its_order(site):
    import callbacks
    from callbacks import Callback
    from callbacks.defaults import default_callbacks
    from trainer import TrainingArguments

    page = _page(site, "reference/callbacks")
    source = open(os.path.join(REPO, "docs", "reference", "callbacks.md"), encoding="utf-8").read()
    classes = [getattr(callbacks, n) for n in callbacks.__all__]
    classes = [c for c in classes if isinstance(c, type) and issubclass(c, Callback) and c is not Callback]
    defaults = {type(cb) for cb in default_callbacks(TrainingArguments(amp="bf16", warmup_steps=1))}
    assert defaults <= set(classes)
    for cls in classes:
        assert f'id="{cls.__module__}.{cls.__name__}"' in page, cls.__name__   # its docstring, rendered
        row = re.search(rf"^\| `{cls.__name__}` \| [^|]+ \| (\d+) \|", source, re.M)
        assert row, f"{cls.__name__} is missing from the built-in callbacks table"
        assert int(row.group(1)) == cls.order, f"{cls.__name__}: the table says order {row.group(1)}, the code {cls.order}"


def test_every_page_is_in_the_nav():
    import yaml

    with open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)

    def pages(nav):
        for item in nav:
            for value in item.values() if isinstance(item, dict) else [item]:
                yield from (pages(value) if isinstance(value, list) else [value])

    in_nav = set(pages(config["nav"]))
    docs = os.path.join(REPO, "docs")
    on_disk = {os.path.relpath(os.path.join(d, f), docs).replace(os.sep, "/")
               for d, _, files in os.walk(docs) for f in files if f.endswith(".md")}
    assert on_disk == in_nav, (on_disk - in_nav, in_nav - on_disk)


def test_the_build_needs_no_network():
    # plugins that fetch at build time (material's privacy, social, optimize; any remote include) stay out,
    # and no web fonts are linked: the site builds and reads offline
    import yaml

    with open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    plugins = {next(iter(p)) if isinstance(p, dict) else p for p in config["plugins"]}
    assert plugins <= {"search", "mkdocstrings"}, plugins
    assert config["theme"]["font"] is False
    snippets = next(e for e in config["markdown_extensions"] if isinstance(e, dict) and "pymdownx.snippets" in e)
    assert not snippets["pymdownx.snippets"].get("url_download"), "snippets must not download"
