"""PaddleNLP's checkpoint fields of sharded runs map onto this project's checkpoints: save_sharded_model,
load_sharded_model and unified_checkpoint ask for what always happens here (never a warning);
unified_checkpoint_config's async_save sets save_async, an unknown word is refused in one line."""

import logging

import pytest

from trainer import ConfigError, TrainingArguments
from trainer.args import paddlenlp_fields


def test_the_sharded_checkpoint_fields_never_warn(caplog):
    paddlenlp_fields._warned.clear()
    with caplog.at_level(logging.WARNING, logger="trainer"):
        args = TrainingArguments(output_dir="out", save_sharded_model=True, load_sharded_model=True,
                                 unified_checkpoint=True, unified_checkpoint_config="skip_save_model_weight")
    assert not [r for r in caplog.records if "without an effect" in r.getMessage()]
    assert args.unified_checkpoint and args.save_sharded_model


@pytest.mark.parametrize("words", ["async_save", "enable_all_options", "master_weight_compatible async_save"])
def test_async_save_sets_save_async(words):
    assert TrainingArguments(output_dir="out", save_async=False, unified_checkpoint_config=words).save_async is True


def test_without_async_save_the_save_async_field_is_kept():
    args = TrainingArguments(output_dir="out", save_async=False, unified_checkpoint_config="skip_save_model_weight")
    assert args.save_async is False


def test_an_unknown_word_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"unified_checkpoint_config='async_sav': async_sav is not known: use any of "
                                          r"skip_save_model_weight, master_weight_compatible, async_save, "
                                          r"enable_all_options$"):
        TrainingArguments(output_dir="out", unified_checkpoint_config="async_sav")
