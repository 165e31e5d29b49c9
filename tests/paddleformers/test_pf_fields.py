"""PaddleFormers' migration table (trainer/args/paddleformers_fields.py) against the installed paddleformers:
every field of its TrainingArguments has a row, the defaults stored for the docs' table are the installed ones,
each row that carries a value lands on a field of ours, and the notes about what PaddleFormers itself does with a
field are true of its source."""

import dataclasses
import os
import re

import pytest

pytest.importorskip("paddleformers")

from paddleformers.trainer import TrainingArguments as PaddleFormersArguments  # noqa: E402

from trainer import TrainingArguments  # noqa: E402
from trainer.args import paddleformers_fields  # noqa: E402
from trainer.args.paddleformers_fields import CARRIED, FIELDS, RENAMED, SWITCHES, target  # noqa: E402
from trainer.compat import table  # noqa: E402
from trainer.layout.plan import PIPELINE_CONFIGS, SHARDING_CONFIGS, TENSOR_CONFIGS  # noqa: E402

THEIRS = {f.name: f for f in dataclasses.fields(PaddleFormersArguments)}
OURS = {f.name: f for f in dataclasses.fields(TrainingArguments)}
KINDS = ("same", "renamed", "default", "recipe", "script", "ignored", "unsupported", "refused")


def _default(f):
    if f.default is not dataclasses.MISSING:
        return getattr(f.default, "value", f.default)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _source(*parts):
    import paddleformers

    with open(os.path.join(os.path.dirname(paddleformers.__file__), *parts), encoding="utf-8") as f:
        return f.read()


def test_every_paddleformers_field_is_in_the_table():
    missing = [name for name in THEIRS if name not in FIELDS]
    assert missing == [], "add these PaddleFormers fields to trainer/args/paddleformers_fields.py FIELDS"
    gone = [name for name in FIELDS if name not in THEIRS]
    assert gone == [], "these rows are not fields of the installed paddleformers: drop them"
    assert {kind for kind, _ in FIELDS.values()} <= set(KINDS)


def test_the_defaults_stored_for_the_docs_are_the_installed_ones():
    """docs/how-to/migrate-paddleformers.md's table is generated without paddleformers, from defaults stored in
    trainer/compat/table.py: they are the installed dataclass's, field for field and in its order."""
    import paddleformers

    assert table.PADDLEFORMERS_VERSION == paddleformers.__version__
    assert list(table.installed_paddleformers_defaults().items()) == list(table.PADDLEFORMERS_DEFAULTS.items()), \
        "run: python -m trainer.compat.table paddleformers-defaults (with paddleformers), then python docs/hooks/generate.py"


def test_each_carried_row_lands_on_a_field_of_ours():
    renamed = {name for name, (kind, _) in FIELDS.items() if kind == "renamed"}
    assert set(RENAMED) | set(CARRIED) == renamed and not set(RENAMED) & set(CARRIED)
    assert set(SWITCHES) <= set(CARRIED)
    for name, (kind, _) in FIELDS.items():
        if kind in ("same", "default"):
            assert name in OURS and target(name) == name, f"{name} is {kind} but not a field of ours"
        if kind == "renamed":
            assert target(name) in OURS and target(name) != name, f"{name} -> {target(name)}, not a field of ours"
        if kind in ("recipe", "script"):  # left in their arguments; ours has PaddleNLP's schedule fields (no effect
            # with our arguments) and a recompute_modules of another meaning: never carried
            assert name not in OURS or name in ("num_cycles", "lr_end", "power", "recompute_modules"), name
    for name in RENAMED:  # carried by value when > 1: degrees, -1 by default as ours
        assert _default(THEIRS[name]) == -1 == _default(OURS[RENAMED[name]]), name
    words = {"sharding_parallel_config": SHARDING_CONFIGS, "tensor_parallel_config": TENSOR_CONFIGS,
             "pipeline_parallel_config": PIPELINE_CONFIGS}
    for name, (ours, word, value) in SWITCHES.items():
        assert word in words[ours], (name, word)
        assert isinstance(_default(THEIRS[name]), bool) and isinstance(value, bool), name


def test_every_row_but_a_plain_same_one_says_why():
    for name, (kind, note) in FIELDS.items():
        if kind != "same" or name in ("sharding_degree", "bf16", "fp16"):
            assert note.strip(), f"{name} ({kind}) needs a note"


def test_same_rows_share_paddleformers_default_and_default_rows_do_not():
    """A ``same`` row whose default differs here would silently change a converted run: it is a ``default`` row."""
    for name, (kind, _) in FIELDS.items():
        if kind == "same":
            assert _default(THEIRS[name]) == _default(OURS[name]), f"{name}: defaults differ, make it a default row"
        if kind == "default" and name != "hybrid_parallel_topo_order":  # None both, read as sharding_first there
            assert _default(THEIRS[name]) != _default(OURS[name]), f"{name}: same default, make it a same row"
    assert _default(THEIRS["amp_master_grad"]) is True and _default(THEIRS["sharding"]) == "stage1"


def test_script_rows_are_not_read_by_paddleformers_trainer():
    """``script``: acted on outside the Trainer under PaddleFormers too, so leaving them to the script is
    PaddleFormers' behaviour: its Trainer and its callbacks never read them."""
    trainer_source = _source("trainer", "trainer.py") + _source("trainer", "trainer_callback.py")
    script = [name for name, (kind, _) in FIELDS.items() if kind == "script"]
    assert len(script) >= 15
    read = [name for name in script if re.search(rf"args\.{name}\b", trainer_source)]
    assert read == []


def test_llm_meta_fields_are_the_model_config_fields_subclasses_gain():
    """``LLM_META``: what ``llmmetaclass`` adds to a subclass (SFTConfig) beyond the table's rows, every one of them,
    none read by PaddleFormers' Trainer (so leaving them to the script is PaddleFormers' behaviour)."""
    from paddleformers.cli.train.sft.sft_config import SFTConfig
    from paddleformers.transformers.configuration_utils import LlmMetaConfig

    from trainer.args.paddleformers_fields import LLM_META

    meta = {name for name, *_ in LlmMetaConfig._get_all_meta() if not hasattr(PaddleFormersArguments, name)}
    assert sorted(LLM_META) == sorted(meta - set(FIELDS)) and len(set(LLM_META)) == len(LLM_META)
    sft = {f.name for f in dataclasses.fields(SFTConfig)}
    assert set(LLM_META) <= sft
    trainer_source = _source("trainer", "trainer.py") + _source("trainer", "trainer_callback.py")
    assert [n for n in LLM_META if re.search(rf"args\.{n}\b|args, \"{n}\"", trainer_source)] == []


def test_fields_paddleformers_reads_nowhere_are_not_read():
    """Rows whose note says PaddleFormers reads the field nowhere: no ``.name`` in any of its modules."""
    import paddleformers

    root = os.path.dirname(paddleformers.__file__)
    package = "\n".join(open(os.path.join(folder, n), encoding="utf-8").read()
                         for folder, _, names in os.walk(root) for n in names if n.endswith(".py"))
    unread = [name for name, (_, note) in FIELDS.items() if "reads it nowhere" in note]
    assert len(unread) >= 3
    assert [name for name in unread if re.search(rf"\.{name}\b", package)] == []


def test_refused_fields_act_in_paddleformers():
    """A ``refused`` row is a field PaddleFormers' Trainer or TrainingArguments acts on (so dropping it would change
    the run): each is read there beyond its declaration."""
    source = _source("trainer", "trainer.py") + _source("trainer", "training_args.py")
    refused = [name for name, (kind, _) in FIELDS.items() if kind == "refused"]
    assert len(refused) >= 8
    assert [name for name in refused if not re.search(rf"(args|self)\.{name}\b", source)] == []


def test_the_counts_in_the_docstring_are_the_table():
    counts = paddleformers_fields.counts()
    assert sum(counts.values()) == len(THEIRS) == 236
    doc = paddleformers_fields.__doc__
    assert f"has its effect {counts['has effect']}" in doc and f"when set {counts['warned']}" in doc
    assert f"refused {counts['refused']}" in doc
    for kind in KINDS:
        n = sum(k == kind for k, _ in FIELDS.values())
        assert re.search(rf"\b{kind} {n}\b", doc) or kind == "refused", (kind, n)


def test_the_generated_table_has_a_row_per_field_with_its_kind():
    rows = table.paddleformers_markdown().splitlines()[2:]
    assert [r.split("|")[1].strip(" `") for r in rows] == list(THEIRS)
    assert "not in the table yet" not in "\n".join(rows)
    row = next(r for r in rows if r.startswith("| `tensor_model_parallel_size`"))
    assert "| renamed | `tensor_parallel_degree` | `-1` |" in row


def test_the_documented_command_stores_the_installed_defaults(tmp_path):
    """``python -m trainer.compat.table paddleformers-defaults`` (docs/how-to/migrate-paddleformers.md), run in a
    copy of the package: it leaves fresh defaults as they are and writes stale ones anew."""
    import shutil
    import subprocess
    import sys

    from helpers import REPO
    from patience import patience

    for package in ("trainer", "callbacks"):  # callbacks beside it: trainer refuses a callbacks package not its own
        shutil.copytree(os.path.join(REPO, package), tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    copy = tmp_path / "trainer" / "compat" / "table.py"
    fresh = copy.read_text(encoding="utf-8")
    command = [sys.executable, "-m", "trainer.compat.table", "paddleformers-defaults"]
    env = dict(os.environ, PYTHONPATH=str(tmp_path))

    def run():
        proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=patience(300))
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout.strip().splitlines()[-1]

    assert run().startswith("unchanged:") and copy.read_text(encoding="utf-8") == fresh
    copy.write_text(fresh.replace("    'sharding': \"'stage1'\",\n", "    'sharding': \"''\",\n"), encoding="utf-8")
    assert copy.read_text(encoding="utf-8") != fresh
    assert run().startswith("wrote") and copy.read_text(encoding="utf-8") == fresh
