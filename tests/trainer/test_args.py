"""TrainingArguments: defaults, every validation error, YAML and command-line loading."""

import pytest

from trainer import ConfigError, TrainingArguments
from trainer.args import parse_overrides


def test_defaults_are_the_documented_ones():
    a = TrainingArguments()
    assert a.max_grad_norm is None and a.warmup_steps == 0 and a.amp == "off"
    assert a.gradient_accumulation_steps == 1 and a.max_steps == -1 and a.data_seed == 0


@pytest.mark.parametrize("field,value,needle", [
    ("learning_rate", -1.0, "learning_rate=-1.0 is not allowed: learning_rate must be a number >= 0"),
    ("per_device_train_batch_size", 0, "per_device_train_batch_size=0 is not allowed: per_device_train_batch_size must be an integer > 0"),
    ("per_device_eval_batch_size", -2, "per_device_eval_batch_size=-2"),
    ("gradient_accumulation_steps", 0, "gradient_accumulation_steps=0 is not allowed"),
    ("logging_steps", 0, "logging_steps=0"),
    ("max_steps", "ten", "max_steps='ten' is not allowed: max_steps must be an integer"),
    ("max_steps", 0, "max_steps=0 is not allowed: max_steps must be -1 (use num_train_epochs) or an integer > 0"),
    ("num_train_epochs", 0, "num_train_epochs=0.0 is not allowed"),
    ("amp", "fp8", "amp='fp8' is not allowed: choose one of off, fp16, bf16"),
    ("amp_level", "O3", "amp_level='O3' is not allowed: choose one of O1, O2"),
    ("lr_scheduler_type", "cosin", "did you mean 'cosine'"),
    ("optim", "adam", "optim='adam' is not allowed: choose one of adamw, momentum, sgd"),
    ("weight_decay", -0.1, "weight_decay=-0.1"),
    ("max_grad_norm", -1, "max_grad_norm=-1.0 is not allowed: max_grad_norm must be None (no clipping) or a number > 0"),
    ("warmup_steps", -1, "warmup_steps=-1"),
    ("warmup_ratio", 1.5, "warmup_ratio=1.5"),
    ("adam_beta1", 1.0, "adam_beta1=1.0"),
    ("adam_beta2", -0.1, "adam_beta2=-0.1"),
    ("adam_epsilon", 0, "adam_epsilon=0.0"),
    ("momentum", 1.0, "momentum=1.0"),
    ("lr_gamma", 0, "lr_gamma=0.0"),
    ("lr_step_size", 0, "lr_step_size=0"),
    ("lr_milestones", [60, 30], "lr_milestones=[60, 30]"),
    ("scale_lr_by_batch", 0, "scale_lr_by_batch=0"),
    ("save_total_limit", 0, "save_total_limit=0"),
    ("eval_steps", -1, "eval_steps=-1"),
    ("save_steps", -5, "save_steps=-5"),
    ("dataloader_num_workers", -1, "dataloader_num_workers=-1"),
    ("evaluation_strategy", "sometimes", "evaluation_strategy='sometimes'"),
    ("save_strategy", "always", "save_strategy='always'"),
    ("device", "tpu", "device='tpu' is not allowed: choose one of auto, cpu, gpu"),
    ("report_to", ["comet"], "report_to='comet' is not allowed"),
    ("dataloader_drop_last", "maybe", "dataloader_drop_last='maybe' is not allowed: dataloader_drop_last must be true or false"),
    ("seed", 1.5, "seed=1.5 is not allowed: seed must be an integer"),
    ("output_dir", " ", "output_dir is empty"),
])
def test_each_bad_value_names_field_value_and_what_is_allowed(field, value, needle):
    with pytest.raises(ConfigError) as info:
        TrainingArguments(**{field: value})
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_interval_strategies_need_their_steps():
    with pytest.raises(ConfigError, match="eval_steps=0 but evaluation_strategy='steps'"):
        TrainingArguments(evaluation_strategy="steps")
    with pytest.raises(ConfigError, match="save_steps=0 but save_strategy='steps'"):
        TrainingArguments(save_steps=0)
    assert TrainingArguments(save_steps=0, save_strategy="no").save_steps == 0


def test_strings_are_coerced_to_field_types():
    a = TrainingArguments(learning_rate="1e-3", max_steps="20", dataloader_drop_last="true",
                          max_grad_norm="none", lr_milestones="10,20", report_to="jsonl")
    assert a.learning_rate == 1e-3 and a.max_steps == 20 and a.dataloader_drop_last is True
    assert a.max_grad_norm is None and a.lr_milestones == [10, 20] and a.report_to == ["jsonl"]


def test_yaml_then_cli_overrides(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("learning_rate: 0.01\nmax_steps: 50\nlogging_steps: 5\n")
    a = TrainingArguments.from_yaml_and_cli(str(cfg), ["--max_steps", "7", "--seed=3"])
    assert (a.learning_rate, a.max_steps, a.logging_steps, a.seed) == (0.01, 7, 5, 3)


def test_unknown_yaml_key_suggests_closest(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("learning_rat: 0.01\n")
    with pytest.raises(ConfigError, match=r"unknown training argument 'learning_rat' in .*run.yaml \(did you mean 'learning_rate'\?\)"):
        TrainingArguments.from_yaml_and_cli(str(cfg))


def test_unknown_cli_flag_suggests_closest():
    with pytest.raises(ConfigError, match=r"unknown training argument '--per_device_batch_size' \(did you mean 'per_device_eval_batch_size'\?\)|did you mean 'per_device_train_batch_size'"):
        parse_overrides(["--per_device_batch_size", "8"], TrainingArguments.field_names())


def test_cli_flag_without_value():
    with pytest.raises(ConfigError, match="'--max_steps' needs a value: write --max_steps VALUE"):
        parse_overrides(["--max_steps"], TrainingArguments.field_names())
    assert parse_overrides(["--learning_rate", "-1"], TrainingArguments.field_names()) == {"learning_rate": "-1"}


def test_yaml_that_does_not_parse_names_file_and_line(tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("learning_rate: 0.1\nmax_steps: [1, 2\nseed: 3\n")
    with pytest.raises(ConfigError) as info:
        TrainingArguments.from_yaml_and_cli(str(cfg))
    msg = str(info.value)
    assert "broken.yaml line" in msg and "YAML does not parse" in msg


def test_missing_yaml_file():
    with pytest.raises(ConfigError, match="config file /nope/x.yaml does not exist"):
        TrainingArguments.from_yaml_and_cli("/nope/x.yaml")


def test_greater_is_better_follows_metric_name():
    assert TrainingArguments(metric_for_best_model="eval_accuracy").greater_is_better_resolved
    assert not TrainingArguments(metric_for_best_model="eval_loss").greater_is_better_resolved


def test_unknown_keyword_in_python_is_the_same_did_you_mean_error_as_the_cli():
    with pytest.raises(ConfigError, match=r"unknown training argument 'learning_rat' .*did you mean 'learning_rate'") as err:
        TrainingArguments(learning_rat=0.1)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
        TrainingArguments.from_yaml_and_cli(None, ["--learning_rat", "0.1"])


def test_save_total_limit_keeps_three_by_default_and_none_keeps_all():
    assert TrainingArguments().save_total_limit == 3
    assert TrainingArguments(save_total_limit=None).save_total_limit is None
    assert TrainingArguments.from_yaml_and_cli(None, ["--save_total_limit", "none"]).save_total_limit is None
