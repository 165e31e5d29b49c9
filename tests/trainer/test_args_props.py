"""Property tests (hypothesis) of the argument parser and TrainingArguments.

Fuzz: any tokens on the command line, any values in a mapping or a YAML file,
end either in valid arguments or in ``trainer.errors.ConfigError``, never in
another exception. Round trip: valid values survive ``--field value``,
``to_dict``/``from_dict`` and a YAML file unchanged.
"""

import dataclasses
import math
import os
import string
import tempfile
import typing

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from trainer.args.paddlenlp_fields import PaddleNLPFields
from trainer.args import AMP_CHOICES, AMP_LEVELS, DATA_FINGERPRINTS, DEVICES, OPTIMIZERS, REPORTERS, SCHEDULERS, STRATEGIES
from trainer.args import TrainingArguments, load_yaml_mapping, parse_overrides
from trainer.errors import ConfigError

FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
ROUND_TRIP = settings(max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck))
NAMES = TrainingArguments.field_names()
HINTS = typing.get_type_hints(TrainingArguments)
FLOAT_FIELDS = [n for n in NAMES if HINTS[n] in (float, typing.Optional[float])]

# ---- fuzz --------------------------------------------------------------------------
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.just(10**400), st.floats(), st.text(max_size=12),
                    st.sampled_from(["", " ", "none", "True", "off", "-1", "0", "1e-3", "nan", "inf", "-inf",
                                     "1,2", "a,b", "adamw", "steps", "epoch", "auto", "fp16", "O2", "jsonl",
                                     "0x10", "1_000", "١٢", "\x00", "--", "=", "１"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                      max_leaves=6)
field_tokens = st.sampled_from(["--" + n for n in NAMES] + ["--" + n.replace("_", "-") for n in NAMES[:5]])
tokens = st.one_of(
    field_tokens,
    st.builds(lambda n, v: f"{n}={v}", field_tokens, st.text(max_size=10)),
    st.text(max_size=10).map(lambda t: "--" + t),
    st.text(max_size=10),
    st.sampled_from(["--", "-", "=", "--=", "--=x", "-1", "--5", "1e5", "nan", "--max_steps=ten"]),
)


def only_config_errors(fn, *args):
    try:
        return fn(*args)
    except ConfigError as exc:
        message = str(exc)
        assert message and "\n" not in message, f"ConfigError message is not one line: {message!r}"
        return None


@FUZZ
@given(argv=st.lists(tokens, max_size=8))
def test_command_line_tokens_raise_only_config_errors(argv):
    only_config_errors(TrainingArguments.from_yaml_and_cli, None, argv)


@FUZZ
@given(mapping=st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=8) | st.integers() | st.none() | st.booleans(),
                               values, max_size=6))
def test_any_mapping_raises_only_config_errors(mapping):
    only_config_errors(TrainingArguments.from_dict, mapping)


@FUZZ
@given(name=st.sampled_from(NAMES), value=values)
def test_any_value_of_any_field_raises_only_config_errors(name, value):
    args = only_config_errors(TrainingArguments.from_dict, {name: value})
    if args is not None:
        assert isinstance(args, TrainingArguments)


@FUZZ
@given(name=st.sampled_from(NAMES), value=st.text(max_size=12))
def test_any_text_on_the_command_line_raises_only_config_errors(name, value):
    only_config_errors(TrainingArguments.from_yaml_and_cli, None, [f"--{name}={value}"])


@FUZZ
@given(content=st.one_of(st.text(max_size=200), st.binary(max_size=200),
                         st.builds(lambda m: yaml.safe_dump(m), st.dictionaries(st.sampled_from(NAMES), values, max_size=4)),
                         st.sampled_from([b"\xff\xfe bad utf-8", "a: [1, 2\n", "!!python/object/apply:os.system ['true']",
                                          "- 1\n- 2\n", "learning_rate: .nan\n", "max_steps: !!binary aGVsbG8=\n",
                                          "a: &x 1\nb: *y\n", "\t-\n", "? [a]\n: 1\n", "1: 2\n", "null: 1\n",
                                          "learning_rate: 1e400\n", "seed: 1e400\n"])))
def test_any_yaml_file_raises_only_config_errors(content):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "args.yaml")
        with open(path, "wb") as f:
            f.write(content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content)
        only_config_errors(load_yaml_mapping, path)
        only_config_errors(TrainingArguments.from_yaml_and_cli, path, [])


@FUZZ
@given(name=st.sampled_from(FLOAT_FIELDS),
       value=st.sampled_from([math.inf, -math.inf, math.nan, "inf", "nan", "-inf"]))
def test_non_finite_numbers_are_refused(name, value):
    with pytest.raises(ConfigError, match=name):
        TrainingArguments.from_dict({name: value, **({"max_steps": 10} if name == "num_train_epochs" else {})})


@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_huge_numbers_are_refused_not_overflowing(name):
    for value in (10**400, "1e400", -(10**400)):
        with pytest.raises(ConfigError, match=name):
            TrainingArguments.from_dict({name: value, **({"max_steps": 10} if name == "num_train_epochs" else {})})


# ---- round trip -------------------------------------------------------------------------
unit = st.floats(min_value=0.0, max_value=0.999)
path_text = st.text(string.ascii_letters + string.digits + "_-./", min_size=1, max_size=20).filter(
    lambda s: s.strip().lower() not in ("none", "null") and not s.startswith("-"))
VALID = {
    "output_dir": path_text,
    "per_device_train_batch_size": st.integers(1, 10**6),
    "per_device_eval_batch_size": st.integers(1, 10**6),
    "gradient_accumulation_steps": st.integers(1, 1024),
    "dataloader_num_workers": st.integers(0, 64),
    "num_train_epochs": st.floats(min_value=1e-3, max_value=1e4),
    "max_steps": st.just(-1) | st.integers(1, 10**9),
    "optim": st.sampled_from(OPTIMIZERS),
    "learning_rate": st.floats(min_value=1e-9, max_value=10.0),
    "weight_decay": st.floats(min_value=0.0, max_value=1.0),
    "adam_beta1": unit,
    "adam_beta2": unit,
    "adam_epsilon": st.floats(min_value=1e-12, max_value=1.0),
    "momentum": unit,
    "max_grad_norm": st.none() | st.floats(min_value=1e-4, max_value=1e4),
    "lr_scheduler_type": st.sampled_from(SCHEDULERS),
    "warmup_steps": st.integers(0, 10**6),
    "warmup_ratio": st.floats(min_value=0.0, max_value=0.99),
    "lr_step_size": st.integers(1, 1000),
    "lr_milestones": st.lists(st.integers(1, 1000), max_size=5).map(sorted),
    "lr_gamma": st.floats(min_value=1e-6, max_value=1.0),
    "scale_lr_by_batch": st.none() | st.integers(1, 65536),
    "amp": st.sampled_from(AMP_CHOICES),
    "amp_level": st.sampled_from(AMP_LEVELS),
    "seed": st.integers(0, 2**31 - 1),
    "data_seed": st.integers(0, 2**31 - 1),
    "logging_steps": st.integers(1, 10**6),
    "report_to": st.lists(st.sampled_from(REPORTERS), unique=True),
    "evaluation_strategy": st.sampled_from(STRATEGIES),
    "eval_steps": st.integers(1, 10**6),
    "save_strategy": st.sampled_from(STRATEGIES),
    "save_steps": st.integers(1, 10**6),
    "save_total_limit": st.none() | st.integers(1, 100),
    "metric_for_best_model": st.none() | st.sampled_from(["eval_accuracy", "eval_loss", "eval_f1"]),
    "greater_is_better": st.none() | st.booleans(),
    # (a directory named like a boolean is spelled ./0: "0", "no", "true"... are the switch's words)
    "resume_from_checkpoint": st.none() | st.just("auto") | path_text.filter(
        lambda s: s.strip().lower() not in ("true", "yes", "1", "false", "no", "0")),
    "device": st.sampled_from([d for d in DEVICES if d != "auto"]),  # auto is resolved to gpu or cpu
    "data_fingerprint": st.sampled_from(DATA_FINGERPRINTS),
    # PaddleNLP spellings that change other fields (tested in tests/compat/test_args_compat.py)
    "fp16": st.just(False),
    "bf16": st.just(False),
    "fp16_opt_level": st.none(),
    "load_best_model_at_end": st.just(False),
    "logging_strategy": st.sampled_from(STRATEGIES),
    "label_names": st.none() | st.lists(st.sampled_from(["labels", "start_positions", "end_positions"]), min_size=1, unique=True),
    # the layout on one process (the degrees must divide the world size; a config word must fit the stage)
    "sharding": st.sampled_from(["", "stage1", "stage2", "stage3", "stage2 offload"]),
    "sharding_parallel_degree": st.sampled_from([-1, 1]),
    "sharding_parallel_config": st.just(""),
    # one process: a degree above 1 would not divide it (test_layout.py checks them against each other)
    "tensor_parallel_degree": st.sampled_from([-1, 1]),
    "pipeline_parallel_degree": st.sampled_from([-1, 1]),
    "tensor_parallel_config": st.sampled_from(["", "enable_mp_async_allreduce"]),
    "pipeline_parallel_config": st.sampled_from(["", "enable_timer disable_batch_p2p_comm"]),
    "hybrid_parallel_topo_order": st.sampled_from([None, "pp_first", "sharding_first"]),
    "recompute_modules": st.none() | st.lists(st.sampled_from(["layers", "encoder.layers", "blocks"]), min_size=1,
                                              unique=True),
}


def _strategy_for(name):
    """Known fields from the table; a field added later gets a value by its type when that is safe."""
    if name in VALID:
        return VALID[name]
    hint = HINTS[name]
    if hint is bool:
        return st.booleans()
    return None


# PaddleNLP's fields without an option here (trainer.args.paddlenlp_fields) are walked in tests/compat/test_args_compat.py
OWN = [n for n in NAMES if n not in {f.name for f in dataclasses.fields(PaddleNLPFields)}]
valid_args = st.fixed_dictionaries({}, optional={n: s for n in OWN if (s := _strategy_for(n)) is not None})
TRUE_WORDS, FALSE_WORDS = ["true", "True", "yes", "1", "on", "ON"], ["false", "False", "no", "0", "off"]


def cli_text(name, value, draw):
    if value is None:
        return draw(st.sampled_from(["none", "None", "null"]))
    if isinstance(value, bool):
        return draw(st.sampled_from(TRUE_WORDS if value else FALSE_WORDS))
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


@ROUND_TRIP
@given(values=valid_args, data=st.data())
def test_valid_values_round_trip_through_the_command_line(values, data):
    try:
        expected = TrainingArguments.from_dict(values)
    except ConfigError:
        assume(False)  # a combination that is invalid as a whole (e.g. eval steps with eval_steps unset)
    argv = []
    for name, value in values.items():
        text = cli_text(name, value, data.draw)
        if data.draw(st.booleans(), label=f"{name} as --field=value") or text.startswith("-") or text == "":
            argv.append(f"--{name}={text}")
        else:
            argv += [f"--{name}", text]
    assert TrainingArguments.from_yaml_and_cli(None, argv) == expected


@ROUND_TRIP
@given(values=valid_args)
def test_valid_values_round_trip_through_a_dict_and_yaml(values):
    try:
        args = TrainingArguments.from_dict(values)
    except ConfigError:
        assume(False)
    assert TrainingArguments.from_dict(args.to_dict()) == args
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "args.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(args.to_dict(), f)
        assert TrainingArguments.from_yaml_and_cli(path, []) == args
    for name, value in values.items():
        assert getattr(args, name) == value, name


def test_every_field_has_a_round_trip_strategy():
    """A new TrainingArguments field needs a row in VALID (or a bool type) to be round-tripped here."""
    missing = [n for n in OWN if _strategy_for(n) is None]
    assert not missing, f"add valid-value strategies for {missing} to VALID"


def test_parse_overrides_examples():
    names = ["max_steps", "learning_rate"]
    assert parse_overrides(["--max_steps", "-1", "--learning_rate=1e-3"], names) == {"max_steps": "-1", "learning_rate": "1e-3"}
    for argv, message in ((["--max_step", "3"], "did you mean '--max_steps'|did you mean 'max_steps'"),
                          (["--max_steps"], "needs a value"), (["max_steps"], "unexpected argument")):
        with pytest.raises(ConfigError, match=message):
            parse_overrides(argv, names)
    assert dataclasses.is_dataclass(TrainingArguments)
