"""TrainingArguments for PaddleNLP users: PdArgumentParser parses ours, the
PaddleNLP spellings map onto our fields, a paddlenlp TrainingArguments converts
field by field (anything set without a counterpart named in one warning), the
migration table covers every PaddleNLP field, and importing the project stays
free of paddlenlp."""

import dataclasses
import importlib.util
import logging
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest
from helpers import REPO, make_mlp
from patience import patience

from trainer import ConfigError, Trainer, TrainingArguments
from trainer.args import paddlenlp_fields

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
    installed = [t for t, module in (("tensorboard", "tensorboardX"), ("wandb", "wandb"), ("mlflow", "mlflow"))
                 if importlib.util.find_spec(module) is not None or (t == "tensorboard" and importlib.util.find_spec("tensorboard"))]
    assert TrainingArguments(report_to=["all"]).report_to == ["tqdm", "jsonl", "visualdl", *installed]  # as PaddleNLP's all
    assert TrainingArguments(resume_from_checkpoint=False).resume_from_checkpoint is None
    with pytest.raises(ConfigError, match="fp16 and bf16 are both set"):
        TrainingArguments(fp16=True, bf16=True)
    with pytest.raises(ConfigError, match=r"fp16=True but amp='bf16'"):
        TrainingArguments(fp16=True, amp="bf16")
    with pytest.raises(ConfigError, match="report_to='comet' is not allowed"):
        TrainingArguments(report_to=["comet"])


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
                               scale_loss=1024, report_to=["visualdl", "autonlp"], device="cpu",
                               max_grad_norm=1.0, per_device_train_batch_size=4)
    paddlenlp_fields._warned.clear()
    with caplog.at_level(logging.WARNING, logger="trainer"):
        trainer = Trainer(make_mlp(), pargs, loss_fn=paddle.nn.CrossEntropyLoss())
    a = trainer.args
    assert isinstance(a, TrainingArguments)
    assert (a.learning_rate, a.num_train_epochs, a.logging_steps, a.evaluation_strategy, a.eval_steps) == (0.02, 2.0, 7, "steps", 3)
    assert (a.max_grad_norm, a.per_device_train_batch_size, a.report_to, a.device, a.flush_at_end) == (1.0, 4, ["visualdl"], "cpu", False)
    assert (a.recompute, a.scale_loss) == (True, 1024.0)  # recompute acts (trainer.parallel); scale_loss has no effect
    assert trainer.layout.recompute is True
    warnings = [r.getMessage() for r in caplog.records if "without an effect here" in r.getMessage()]
    assert len(warnings) == 1 and "recompute" not in warnings[0] and "scale_loss=1024" in warnings[0]
    assert "hybrid_parallel_topo_order" not in warnings[0] and "logging_dir" not in warnings[0]  # PaddleNLP set those
    assert any("report_to autonlp" in r.getMessage() for r in caplog.records if "no counterpart" in r.getMessage())


#: PaddleNLP's parallel fields, TrainingArguments' own (beside sharding: the Layout plans them), with PaddleNLP's types
PARALLEL = ("tensor_parallel_degree", "pipeline_parallel_degree", "tensor_parallel_config", "pipeline_parallel_config",
            "hybrid_parallel_topo_order")


def test_every_paddlenlp_field_exists_on_ours_with_its_name_type_and_default(caplog):
    """Walk paddlenlp's dataclass: each field reads on ours; a field ours lacks an option for has PaddleNLP's
    type and default, parses with PdArgumentParser, and set to another value is named once in a warning."""
    pytest.importorskip("paddlenlp")
    import typing

    from paddlenlp.trainer import PdArgumentParser
    from paddlenlp.trainer import TrainingArguments as PaddleNLPArguments

    def base(hint):  # Optional[X] -> X: PaddleNLP writes `int = None` where we write Optional[int]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint

    def default(f):
        return f.default if f.default is not dataclasses.MISSING else f.default_factory()

    theirs, hints_theirs = dataclasses.fields(PaddleNLPArguments), typing.get_type_hints(PaddleNLPArguments)
    ours_fields, hints_ours = {f.name: f for f in dataclasses.fields(TrainingArguments)}, typing.get_type_hints(TrainingArguments)
    ours = TrainingArguments(output_dir="x")
    only_theirs = set(TrainingArguments.no_effect_fields()) | set(paddlenlp_fields.WITH_EFFECT)
    mixin = {g.name for g in dataclasses.fields(paddlenlp_fields.PaddleNLPFields)}
    for f in theirs:
        getattr(ours, f.name)  # no AttributeError
        if f.name in only_theirs | set(PARALLEL):
            assert base(hints_ours[f.name]) == base(hints_theirs[f.name]), f.name
            assert default(ours_fields[f.name]) == default(f), f.name
            assert (f.name in mixin) == (f.name in only_theirs), f.name
    assert len(only_theirs) >= 39  # the PaddleNLP-only fields (the parallel ones are our own, beside sharding)
    assert set(PARALLEL) <= set(ours_fields) and not set(PARALLEL) & (mixin | only_theirs)  # ours, not PaddleNLP-only
    paddlenlp_fields._warned.clear()
    with caplog.at_level(logging.WARNING, logger="trainer"):
        (parsed,) = PdArgumentParser((TrainingArguments,)).parse_args_into_dataclasses(
            ["--output_dir", "o", "--lazy_data_processing", "false", "--logging_dir", "logs", "--recompute", "--no_cuda"])
        TrainingArguments(lazy_data_processing=False, use_expert_parallel=True)  # lazy_data_processing: warned already
        # a degree of 1 is "off", never a warning; sharding_degree is PaddleNLP's older sharding_parallel_degree
        TrainingArguments(tensor_parallel_degree=1, pipeline_parallel_degree=1, sep_parallel_degree=1)
        assert TrainingArguments(sharding="stage1", sharding_degree=1).sharding_parallel_degree == 1
    assert (parsed.lazy_data_processing, parsed.logging_dir, parsed.recompute, parsed.device) == (False, "logs", True, "cpu")
    warnings = [r.getMessage() for r in caplog.records if "without an effect here" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "lazy_data_processing=" in warnings[0]
    assert all(n not in warnings[0] for n in ("no_cuda", "logging_dir", "recompute"))  # they have an effect
    assert "use_expert_parallel=True" in warnings[1] and "lazy_data_processing" not in warnings[1]


def test_learning_rate_zero_is_accepted_and_trains_nothing_under_both_trainers(tmp_path):
    """PaddleNLP and Hugging Face accept learning_rate 0 (frozen runs, event-flow tests): so do we."""
    pytest.importorskip("paddlenlp")
    from paddlenlp.trainer import Trainer as PaddleNLPTrainer
    from paddlenlp.trainer import TrainingArguments as PaddleNLPArguments

    class Linear(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle.nn.Linear(4, 2)

        def forward(self, x, labels=None):
            logits = self.fc(x)
            return logits if labels is None else (paddle.nn.functional.cross_entropy(logits, labels), logits)

    rng = np.random.RandomState(0)
    data = [{"x": rng.randn(4).astype("float32"), "labels": np.int64(i % 2)} for i in range(32)]
    assert TrainingArguments(learning_rate=0).learning_rate == 0.0
    for name, cls in (("paddlenlp", PaddleNLPTrainer), ("ours", Trainer)):
        paddle.seed(3)
        model = Linear()
        before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
        args = PaddleNLPArguments(str(tmp_path / name), learning_rate=0.0, max_steps=3, report_to=[], device="cpu",
                                  disable_tqdm=True, save_strategy="no", per_device_train_batch_size=8)
        out = cls(model=model, args=args, train_dataset=data).train()
        assert out.global_step == 3 and np.isfinite(out.training_loss), name
        for k, v in model.state_dict().items():
            np.testing.assert_array_equal(v.numpy(), before[k], err_msg=f"{name}: {k}")


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

    from trainer.args.fields_table import FIELDS

    names = [f.name for f in dataclasses.fields(PaddleNLPArguments)]
    assert [n for n in names if n not in FIELDS] == [], "add these PaddleNLP fields to trainer.args.fields_table.FIELDS"
    with open(GUIDE, encoding="utf-8") as f:
        guide = f.read()
    missing = [n for n in names if f"| `{n}` |" not in guide]
    assert missing == [], "add these fields to the table in docs/how-to/migrate-paddlenlp.md (python -m trainer.compat.table)"
    ours = set(TrainingArguments.field_names())
    for name, (kind, _) in FIELDS.items():
        assert name in ours, f"{name} is in the table but is not our field"


def test_importing_the_project_does_not_import_paddlenlp():
    code = ("import sys, trainer, callbacks, trainer.compat\n"
            "trainer.Trainer; trainer.TrainingArguments(output_dir='x')\n"
            "from trainer.compat import door, api, paddlenlp_callbacks, hapi_callbacks, args_convert\n"
            "assert 'paddlenlp' not in sys.modules, sorted(m for m in sys.modules if 'paddlenlp' in m)[:5]\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=patience(300))
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("module", ["trainer.args.aliases", "trainer.metric_keys", "trainer.compat.outputs",
                                    "trainer.data.columns"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


def test_the_migration_table_states_every_default_and_type_that_differs():
    """A field whose default differs is marked "different default" (disable_tqdm once said "same"), the guide's
    table is the one ``python -m trainer.compat.table`` prints, and it names each of the 12 type differences."""
    pytest.importorskip("paddlenlp")
    import typing

    from paddlenlp.trainer import TrainingArguments as PaddleNLPArguments

    from trainer.args.fields_table import FIELDS
    from trainer.compat.table import markdown, type_name

    def default(f):
        if f.default is not dataclasses.MISSING:
            return getattr(f.default, "value", f.default)
        return "required" if f.default_factory is dataclasses.MISSING else f.default_factory()

    ours = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    differ = sorted(f.name for f in dataclasses.fields(PaddleNLPArguments) if default(f) != default(ours[f.name]))
    assert differ == sorted(n for n, (kind, _) in FIELDS.items() if kind == "default"), differ
    assert len(differ) == 11 and "disable_tqdm" in differ
    hints_theirs, hints_ours = typing.get_type_hints(PaddleNLPArguments), typing.get_type_hints(TrainingArguments)
    types = [n for n in hints_theirs if n in ours and type_name(hints_theirs[n]) != type_name(hints_ours[n])]
    with open(GUIDE, encoding="utf-8") as f:
        guide = f.read()
    assert markdown() in guide, "regenerate the table in docs/how-to/migrate-paddlenlp.md: python -m trainer.compat.table"
    assert len(types) == 12 and all(f"| `{n}` |" in guide for n in types), types
