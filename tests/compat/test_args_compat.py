"""TrainingArguments for PaddleNLP users: PdArgumentParser parses ours, the
PaddleNLP spellings map onto our fields, a paddlenlp TrainingArguments converts
field by field (anything set without a counterpart named in one warning), the
migration table covers every PaddleNLP field, and importing the project stays
free of paddlenlp."""

import dataclasses
import logging
import os
import subprocess
import sys

import paddle
import pytest
from helpers import REPO, make_mlp

from trainer import ConfigError, Trainer, TrainingArguments

GUIDE = os.path.join(REPO, "docs", "how-to", "migrate-paddlenlp.md")


def test_pdargumentparser_parses_our_arguments_with_paddlenlp_flags():
    pytest.importorskip("paddlenlp")
    from paddlenlp.trainer import PdArgumentParser

    (args,) = PdArgumentParser((TrainingArguments,)).parse_args_into_dataclasses([
        "--output_dir", "out", "--do_train", "--do_eval", "--fp16", "--fp16_opt_level", "O2", "--report_to", "none",
        "--max_grad_norm", "0", "--logging_strategy", "epoch", "--load_best_model_at_end", "--save_strategy", "epoch",
        "--metric_for_best_model", "accuracy", "--label_names", "start_positions", "end_positions",
        "--lr_milestones", "2", "5", "--resume_from_checkpoint", "true", "--overwrite_output_dir" if
        "overwrite_output_dir" in TrainingArguments.field_names() else "--do_predict"])
    assert (args.do_train, args.do_eval, args.amp, args.amp_level, args.report_to) == (True, True, "fp16", "O2", [])
    assert args.max_grad_norm is None and args.logging_strategy == "epoch" and args.lr_milestones == [2, 5]
    assert args.label_names == ["start_positions", "end_positions"] and args.resume_from_checkpoint == "auto"
    paddle.set_device(args.device)  # auto resolved to what paddle.set_device takes
    assert (args.local_rank, args.world_size, args.process_index) == (-1, 1, 0)


def test_paddlenlp_spellings():
    assert TrainingArguments(bf16=True).amp == "bf16"
    assert TrainingArguments(report_to=["all"]).report_to == ["tqdm", "jsonl", "visualdl"]
    assert TrainingArguments(resume_from_checkpoint=False).resume_from_checkpoint is None
    with pytest.raises(ConfigError, match="fp16 and bf16 are both set"):
        TrainingArguments(fp16=True, bf16=True)
    with pytest.raises(ConfigError, match=r"fp16=True but amp='bf16'"):
        TrainingArguments(fp16=True, amp="bf16")
    with pytest.raises(ConfigError, match="report_to='wandb' is not allowed"):
        TrainingArguments(report_to=["wandb"])


def test_print_config_logs_every_field(caplog):
    with caplog.at_level(logging.INFO, logger="trainer"):
        TrainingArguments(output_dir="somewhere").print_config()
    text = caplog.text
    assert "TrainingArguments Configuration Arguments" in text and "somewhere" in text
    assert all(name in text for name in TrainingArguments.field_names())


def test_paddlenlp_arguments_convert_field_by_field(tmp_path, caplog):
    pytest.importorskip("paddlenlp")
    from paddlenlp.trainer import TrainingArguments as PaddleNLPArguments

    pargs = PaddleNLPArguments(str(tmp_path), learning_rate=0.02, num_train_epochs=2, logging_steps=7,
                               evaluation_strategy="steps", eval_steps=3, fp16=False, recompute=True,
                               scale_loss=1024, report_to=["visualdl", "wandb"], device="cpu",
                               max_grad_norm=1.0, per_device_train_batch_size=4)
    with caplog.at_level(logging.WARNING, logger="trainer"):
        trainer = Trainer(make_mlp(), pargs, loss_fn=paddle.nn.CrossEntropyLoss())
    a = trainer.args
    assert isinstance(a, TrainingArguments)
    assert (a.learning_rate, a.num_train_epochs, a.logging_steps, a.evaluation_strategy, a.eval_steps) == (0.02, 2.0, 7, "steps", 3)
    assert (a.max_grad_norm, a.per_device_train_batch_size, a.report_to, a.device, a.flush_at_end) == (1.0, 4, ["visualdl"], "cpu", False)
    warnings = [r.getMessage() for r in caplog.records if "no counterpart" in r.getMessage()]
    assert len(warnings) == 1 and "recompute=True" in warnings[0] and "report_to wandb" in warnings[0]
    assert "scale_loss=1024" in warnings[0] and "hybrid_parallel_topo_order" not in warnings[0]


def test_a_paddlenlp_arguments_subclass_converts_and_names_its_own_fields(tmp_path, caplog):
    pytest.importorskip("paddlenlp")
    from paddlenlp.trainer import TrainingArguments as PaddleNLPArguments

    @dataclasses.dataclass
    class MyArguments(PaddleNLPArguments):  # as CompressionArguments extends it
        prune_ratio: float = 0.0

    with caplog.at_level(logging.WARNING, logger="trainer"):
        trainer = Trainer(make_mlp(), MyArguments(str(tmp_path), prune_ratio=0.5, learning_rate=0.3, device="cpu"),
                          loss_fn=paddle.nn.CrossEntropyLoss())
    assert trainer.args.learning_rate == 0.3
    assert any("prune_ratio=0.5" in r.getMessage() for r in caplog.records)


def test_unknown_trainer_keywords_suggest_a_name():
    with pytest.raises(ConfigError, match=r"unknown keyword 'data_colator' \(did you mean 'data_collator'\?\)"):
        Trainer(make_mlp(), data_colator=None)
    with pytest.raises(ConfigError, match="both collate_fn and data_collator were given"):
        Trainer(make_mlp(), collate_fn=lambda b: b, data_collator=lambda b: b)


def test_the_migration_table_lists_every_paddlenlp_field():
    pytest.importorskip("paddlenlp")
    from paddlenlp.trainer import TrainingArguments as PaddleNLPArguments

    from trainer.compat.args_convert import FIELDS

    names = [f.name for f in dataclasses.fields(PaddleNLPArguments)]
    assert [n for n in names if n not in FIELDS] == [], "add these PaddleNLP fields to trainer.compat.args_convert.FIELDS"
    with open(GUIDE, encoding="utf-8") as f:
        guide = f.read()
    missing = [n for n in names if f"| `{n}` |" not in guide]
    assert missing == [], "add these fields to the table in docs/how-to/migrate-paddlenlp.md (python -m trainer.compat.table)"
    ours = set(TrainingArguments.field_names())
    for name, (kind, _) in FIELDS.items():
        if kind in ("same", "default"):
            assert name in ours or name == "overwrite_output_dir", f"{name} is listed as {kind} but is not our field"


def test_importing_the_project_does_not_import_paddlenlp():
    code = ("import sys, trainer, callbacks, trainer.compat\n"
            "trainer.Trainer; trainer.TrainingArguments(output_dir='x')\n"
            "from trainer.compat import door, api, paddlenlp_callbacks, hapi_callbacks, args_convert\n"
            "assert 'paddlenlp' not in sys.modules, sorted(m for m in sys.modules if 'paddlenlp' in m)[:5]\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("module", ["trainer.args_aliases", "trainer.metric_keys", "trainer.compat.outputs",
                                    "trainer.data.columns"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
