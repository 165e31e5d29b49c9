"""The door for PaddleFormers (trainer.compat.door, args_convert, paddlenlp_callbacks, api): its
``TrainingArguments`` (and subclasses) converted field by field, its renamed parallel and recompute fields on
our layout, its ``Trainer`` keywords (``tokenizer`` with its collators, ``processing_class``,
``resume_from_custom_func``), its ``TrainerCallback`` with ``on_save_hf``, and ``save_model`` writing what
``from_pretrained`` loads. The script runs are subprocesses of tests/paddleformers/scripts/pf_finetune.py as
written (PaddleFormers' Trainer) and with only its import changed (ours)."""

import dataclasses
import logging
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pf_helpers import BASE_ARGS, read_logs, run_script  # noqa: E402
from test_pf_numbers import compare  # noqa: E402


def _tiny_llama():
    import paddle
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

    paddle.seed(1)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                        fuse_rms_norm=False))


def _their_args(tmp_path, cls=None, **kw):
    from paddleformers.trainer import TrainingArguments

    return (cls or TrainingArguments)(output_dir=str(tmp_path / "out"), amp_master_grad=False, device="cpu",
                                      report_to="none", **kw)


def test_a_subclass_of_its_arguments_comes_through_field_by_field(tmp_path, caplog):
    from paddleformers.trainer import TrainingArguments

    from trainer import Trainer
    from trainer.compat.paddleformers_recipe import PaddleFormersRecipe

    @dataclasses.dataclass
    class ScriptArguments(TrainingArguments):  # as SFTConfig: a subclass with fields of its own
        max_seq_len: int = 128

    args = _their_args(tmp_path, ScriptArguments, max_seq_len=64, learning_rate=3e-4, max_steps=5, seed=11,
                       recompute_granularity="full", recompute_method="uniform", save_hf_steps=2,
                       save_strategy="steps", logging_steps=2)
    with caplog.at_level(logging.WARNING, logger="trainer"):
        trainer = Trainer(model=_tiny_llama(), args=args)
    ours = trainer.args
    assert (ours.learning_rate, ours.max_steps, ours.seed, ours.logging_steps) == (3e-4, 5, 11, 2)
    assert ours.recompute is True  # PaddleFormers has no recompute switch: recompute_granularity turns ours on
    assert ours.sharding == ""  # its default stage1 is [] on one process
    assert isinstance(trainer.recipe, PaddleFormersRecipe)
    warned = [r.getMessage() for r in caplog.records if "no counterpart" in r.getMessage()]
    assert len(warned) == 1, warned  # one warning, naming each set field without an effect here, and only those
    assert "paddleformers TrainingArguments" in warned[0]
    assert "max_seq_len=64" in warned[0]  # a field of the subclass that no table names
    assert "migrate-paddleformers.md" in warned[0]
    for quiet in ("context_parallel_size", "amp_master_grad", "recompute_granularity", "save_hf_steps",
                  "recompute_method"):  # the model config's (script): left alone, as under PaddleFormers
        assert quiet not in warned[0]


def test_split_param_is_a_word_of_our_sharding_config(tmp_path):
    from trainer.compat.args_convert import convert_args

    args = _their_args(tmp_path, sharding="stage1", split_param=True)
    args.sharding = ["stage1"]  # what its __post_init__ leaves on two processes
    assert "split_param" in convert_args(args, "paddleformers").sharding_parallel_config.split()
    args.split_param = False
    assert "split_param" not in convert_args(args, "paddleformers").sharding_parallel_config.split()


def test_other_arguments_are_refused_in_one_line(tmp_path):
    from trainer import Trainer
    from trainer.errors import ConfigError

    class Elsewhere:
        output_dir = str(tmp_path)

    with pytest.raises(ConfigError, match="paddleformers TrainingArguments.*Elsewhere"):
        Trainer(model=_tiny_llama(), args=Elsewhere())
    with pytest.raises(ConfigError, match="unknown keyword 'processing_clas'.*processing_class"):
        Trainer(model=_tiny_llama(), args=_their_args(tmp_path), processing_clas=None)


def test_padding_collator_tokenizer_processing_class_and_custom_resume(tmp_path):
    """Samples of different lengths padded by its DataCollatorForSeq2Seq: the same numbers; the tokenizer and the
    processing class (an image processor) saved with the model, as by its Trainer; resume_from_custom_func
    called once with the model."""
    argv = BASE_ARGS + ["--padded", "true", "--custom_resume", "true"]
    theirs = run_script(tmp_path, "theirs", False, argv)
    ours = run_script(tmp_path, "ours", True, argv)
    compare(read_logs(theirs), read_logs(ours), "padded")
    assert read_logs(ours)["hooks"] == read_logs(theirs)["hooks"] == [["resume_from_custom_func", "LlamaForCausalLM"]]
    for name in ("tokenizer_config.json", "preprocessor_config.json"):
        assert os.path.exists(os.path.join(theirs, name)) and os.path.exists(os.path.join(ours, name)), name


def test_on_save_hf_fires_when_paddleformers_does_and_what_it_saved_loads(tmp_path):
    import numpy as np
    from paddleformers.transformers import LlamaForCausalLM

    argv = [a for a in BASE_ARGS] + ["--save_hf_steps", "3", "--save_steps", "6"]
    argv[argv.index("--save_strategy") + 1] = "steps"
    theirs = run_script(tmp_path, "theirs", False, argv)
    ours = run_script(tmp_path, "ours", True, argv)
    assert read_logs(ours)["hooks"] == read_logs(theirs)["hooks"] == [["on_save_hf", 3], ["on_save", 6],
                                                                      ["on_save_hf", 6]]
    assert read_logs(ours)["order"] == read_logs(theirs)["order"]  # on_save_hf last in its step, after on_log
    assert sorted(d for d in os.listdir(ours) if d.startswith("hf_checkpoint")) == \
        sorted(d for d in os.listdir(theirs) if d.startswith("hf_checkpoint")) == ["hf_checkpoint-3", "hf_checkpoint-6"]
    # the last hf checkpoint and save_model's output_dir hold the same trained weights, and from_pretrained loads both
    last, final = (LlamaForCausalLM.from_pretrained(os.path.join(ours, d)) for d in ("hf_checkpoint-6", "."))
    for (name, a), b in zip(last.state_dict().items(), final.state_dict().values()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
    first = LlamaForCausalLM.from_pretrained(os.path.join(ours, "hf_checkpoint-3"))
    assert any(not np.array_equal(a.numpy(), b.numpy()) for a, b in zip(first.parameters(), last.parameters()))


def test_save_hf_total_limit_keeps_the_newest_hf_checkpoints_as_paddleformers_does(tmp_path):
    """hf saves at steps 2, 4 and 6 with save_hf_total_limit 2: both Trainers keep hf_checkpoint-4 and -6 (the
    older one removed after step 6's save), and on_save_hf fired at each of the three steps."""
    argv = [a for a in BASE_ARGS] + ["--save_hf_steps", "2", "--save_steps", "6", "--save_hf_total_limit", "2"]
    argv[argv.index("--save_strategy") + 1] = "steps"
    theirs = run_script(tmp_path, "theirs", False, argv)
    ours = run_script(tmp_path, "ours", True, argv)
    saved = [h for h in read_logs(theirs)["hooks"] if h[0] == "on_save_hf"]
    assert saved == [h for h in read_logs(ours)["hooks"] if h[0] == "on_save_hf"] == [["on_save_hf", s] for s in (2, 4, 6)]
    assert sorted(d for d in os.listdir(ours) if d.startswith("hf_checkpoint")) == \
        sorted(d for d in os.listdir(theirs) if d.startswith("hf_checkpoint")) == ["hf_checkpoint-4", "hf_checkpoint-6"]


def test_its_model_defaults_train_on_cpu_with_recompute(tmp_path, caplog):
    """A PaddleFormers Llama with its config's defaults (fuse_rms_norm=True: a GPU kernel) fails at the first step
    under its own Trainer on CPU; ours turns the fused norm off, says so once, and trains, recomputing its blocks
    as recompute_granularity asks."""
    import paddle
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

    from trainer import Trainer

    paddle.seed(1)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64))
    x = paddle.randint(0, 64, [2, 8])
    with pytest.raises(RuntimeError, match="fused_rms_norm_ext"):
        model(input_ids=x, labels=x)
    data = [{"input_ids": row, "labels": row} for row in paddle.randint(0, 64, [8, 8]).numpy()]
    with caplog.at_level(logging.WARNING, logger="trainer"):
        trainer = Trainer(model=model, args=_their_args(tmp_path, max_steps=2, save_strategy="no",
                                                        recompute_granularity="full"), train_dataset=data)
    assert sum("fuse_rms_norm" in r.getMessage() for r in caplog.records) == 1
    out = trainer.train()
    assert out.global_step == 2 and out.training_loss > 0
    # recompute_granularity: its decoder layers run under recompute (its Llama has no enable_recompute switch)
    assert [type(layer).__name__ for layer in model.sublayers() if getattr(layer, "_trainer_recompute", False)] == \
        ["LlamaDecoderLayer", "LlamaDecoderLayer"]


def test_a_layout_this_build_cannot_run_is_refused_in_one_line_with_its_name(tmp_path):
    """tensor_model_parallel_size=2 on two CPU processes: our refusal (tensor parallel needs a GPU), before anything
    is launched into the model, naming the field as the script set it."""
    with pytest.raises(AssertionError) as failed:
        run_script(tmp_path, "ours", True, BASE_ARGS + ["--sharding=", "--tensor_model_parallel_size", "2"], nproc=2)
    refusal = [line for line in str(failed.value).splitlines() if "ConfigError" in line]
    assert refusal and "tensor_model_parallel_size=2 needs a GPU" in refusal[-1], str(failed.value)[-3000:]
    assert "tensor_parallel_degree" not in refusal[-1]


@pytest.mark.parametrize("field, value", [("sequence_parallel", True), ("context_parallel_size", 2),
                                          ("use_lowprecision_moment", True), ("expert_model_parallel_size", 2)])
def test_a_refused_field_set_stops_at_the_door_in_one_line_naming_it_and_why(tmp_path, field, value):
    """The table's ``refused`` rows: honoured neither here nor silently dropped (another run's numbers)."""
    from trainer import Trainer
    from trainer.args.paddleformers_fields import FIELDS
    from trainer.errors import ConfigError

    args = _their_args(tmp_path)
    setattr(args, field, value)  # as a script sets it after construction (its __post_init__ checks some on GPU only)
    with pytest.raises(ConfigError) as info:
        Trainer(model=_tiny_llama(), args=args)
    message = str(info.value)
    assert "\n" not in message and f"{field}={value!r}" in message and FIELDS[field][1] in message
    setattr(args, field, 1 if field.endswith("_size") else False)  # off: the door lets it through
    assert Trainer(model=_tiny_llama(), args=args).args.tensor_parallel_degree in (-1, 1)


def test_its_switches_and_find_unused_parameters_are_carried_where_their_layout_runs(tmp_path):
    from trainer.compat.args_convert import convert_args

    args = _their_args(tmp_path, sharding="stage1", stage1_overlap=True, ddp_find_unused_parameters=True,
                       mp_async_allreduce=True)
    args.sharding = ["stage1"]  # what its __post_init__ leaves on two processes
    ours = convert_args(args, "paddleformers")
    assert {"enable_stage1_overlap", "split_param"} <= set(ours.sharding_parallel_config.split())
    assert ours.find_unused_parameters is True
    assert ours.tensor_parallel_config == ""  # no tensor parallel in this run: its switch is not read, as there
    args.sharding, args.stage1_overlap, args.ddp_find_unused_parameters = [], False, None
    ours = convert_args(args, "paddleformers")
    assert ours.sharding_parallel_config == "" and ours.find_unused_parameters is False


def test_refusals_and_warnings_speak_paddleformers(tmp_path, caplog, monkeypatch):
    """What a PaddleFormers script set is what a refusal or the one warning names: its switch (split_param), not our
    sharding_parallel_config; amp_master_grad (its default True) under O1 is what PaddleFormers makes of it, nothing;
    fields without an effect named once, with why, in the one paddleformers warning (none calls them PaddleNLP's)."""
    from trainer.args import paddlenlp_fields
    from trainer.compat.args_convert import convert_args
    from trainer.errors import ConfigError

    o1 = _their_args(tmp_path, bf16=True)
    o1.amp_master_grad = True  # PaddleFormers accepts it with bf16 at its default fp16_opt_level O1
    assert convert_args(o1, "paddleformers").amp_master_grad is False
    quiet = _their_args(tmp_path, save_on_each_node=True, log_on_each_node=False, release_grads=True)
    paddlenlp_fields._warned.clear()
    with caplog.at_level(logging.WARNING, logger="trainer"):
        convert_args(quiet, "paddleformers")
    warned = [r.getMessage() for r in caplog.records if "save_on_each_node" in r.getMessage()]
    assert len(warned) == 1 and "paddleformers TrainingArguments" in warned[0] and "PaddleNLP" not in warned[0]
    assert all(f in warned[0] for f in ("log_on_each_node=False", "release_grads=True"))
    split = _their_args(tmp_path)
    split.sharding, split.split_param = ["stage1"], True  # its stage1 on two processes, split_param its default
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    with pytest.raises(ConfigError) as info:
        convert_args(split, "paddleformers")
    assert "split_param=True needs a GPU" in str(info.value) and "set split_param=False" in str(info.value)
    assert "sharding_parallel_config" not in str(info.value)


def test_two_processes_evaluate_its_batches_and_give_predictions_in_dataset_order(tmp_path):
    """Evaluation on 2 processes reads PaddleFormers' batches (samples dealt to the ranks in turn): eval_loss, a mean
    of batch means, is its own when the samples' label counts differ; predict() gives rows in dataset order."""
    argv = BASE_ARGS + ["--eval_ragged", "true", "--evaluation_strategy", "steps", "--eval_steps", "3",
                        "--per_device_eval_batch_size", "2", "--sharding", ""]
    theirs = run_script(tmp_path, "theirs", False, argv, nproc=2)
    ours = run_script(tmp_path, "ours", True, argv, nproc=2)
    compare(read_logs(theirs), read_logs(ours), "eval on 2 processes")
    assert sum("eval_loss" in r for r in read_logs(ours)["logs"]) == 2
    assert read_logs(ours)["labels_in_order"] is True


def test_its_schedule_reads_min_lr_and_freeze_training_from_its_arguments(tmp_path):
    from paddleformers.trainer.trainer_utils import get_scheduler

    from trainer.compat.paddleformers_recipe import PaddleFormersRecipe

    args = _their_args(tmp_path, learning_rate=1e-3, lr_scheduler_type="cosine", min_lr=1e-4)
    ours = PaddleFormersRecipe(args).schedule(2, 10)
    theirs = get_scheduler("cosine", learning_rate=1e-3, num_warmup_steps=2, num_training_steps=10, min_lr=1e-4)
    lrs = []
    for _ in range(10):
        lrs.append((ours.get_lr(), theirs.get_lr()))
        ours.step(), theirs.step()
    assert [a for a, _ in lrs] == [b for _, b in lrs] and min(a for a, _ in lrs[2:]) >= 1e-4
    args.freeze_training = True
    frozen = PaddleFormersRecipe(args).schedule(2, 10)
    assert frozen.get_lr() == 0.0
