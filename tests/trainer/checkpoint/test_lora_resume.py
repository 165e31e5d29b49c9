"""A PaddleNLP ``LoRAModel`` (paddlenlp.peft) resumes bitwise, as PaddleFormers' does (tests/paddleformers/).

Its ``set_state_dict`` takes the inner model's names and skips every other key without a word: a resume through
it restored nothing and the resumed run's losses drifted from step 6 (``trainer.layout.adapters.set_state``).
"""

import json
import os
import shutil
import sys

import numpy as np
import paddle
import pytest
from paddlenlp.peft import LoRAConfig, LoRAModel
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM
from safetensors.numpy import load_file

from trainer import Trainer, TrainingArguments
from trainer.checkpoint.load import load_weights
from trainer.cli.describe import describe_checkpoint
from trainer.errors import ConfigError, DataError


def base_llama(vocab_size=64, nudge=0.0) -> LlamaForCausalLM:
    """The base model of every run here; ``vocab_size`` / ``nudge`` (added to one weight): another base."""
    paddle.seed(1)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                        max_position_embeddings=64))
    if nudge:
        weight = base.llama.layers[1].mlp.down_proj.weight
        weight.set_value(weight + nudge)
    return base


def lora_llama(vocab_size=64, nudge=0.0) -> LoRAModel:
    """The LoRA model of every run here, on :func:`base_llama`."""
    return LoRAModel(base_llama(vocab_size, nudge),
                     LoRAConfig(target_modules=[".*q_proj", ".*v_proj"], r=4, lora_alpha=8, lora_dropout=0.1))


class Tokens(paddle.io.Dataset):
    def __init__(self):
        self.x = np.random.RandomState(0).randint(0, 64, (32, 16)).astype("int64")

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def train(out, resume=None, model=None, **more) -> Trainer:
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=12, logging_steps=1,
                             learning_rate=1e-2, save_steps=5, report_to=[], **more)
    trainer = Trainer(model or lora_llama(), args, train_dataset=Tokens())
    trainer.fit(resume_from_checkpoint=resume)
    return trainer


def test_a_paddlenlp_lora_model_resumes_bitwise_and_its_checkpoint_records_the_adapter(tmp_path):
    full = train(tmp_path / "full")
    train(tmp_path / "part")
    resumed = train(tmp_path / "part", resume=str(tmp_path / "part" / "checkpoints" / "step-5"))
    losses = [[(r["step"], r["loss"]) for r in t.state.log_history if "loss" in r] for t in (full, resumed)]
    assert len(losses[0]) == 12 and losses[1] == losses[0]
    want, got = full.model.state_dict(), resumed.model.state_dict()
    for k in want:
        np.testing.assert_array_equal(got[k].numpy(), want[k].numpy(), err_msg=k)
    with open(tmp_path / "full" / "checkpoints" / "step-10" / "trainer.json", encoding="utf-8") as f:
        adapter = json.load(f)["adapter"]
    assert (adapter["type"], adapter["r"], adapter["lora_alpha"], adapter["adapted_layers"]) == ("LoRA", 4, 8, 4)
    assert adapter["trainable_parameters"] == sum(int(np.prod(p.shape)) for p in full.model.parameters()
                                                  if not p.stop_gradient) == 4 * 2 * 32 * 4


def test_the_checkpoint_holds_the_adapter_without_its_frozen_base_and_refuses_another_base(tmp_path):
    """What a LoRA run saves is what it trains: the 8 LoRA tensors (5 kB here instead of 106 kB; ~28 GB less per
    checkpoint for a 7B base in float32), beside a record of the frozen base that a resume checks: another base,
    by its shapes or by a single nudged weight, is refused in one line; the same base resumes (test above)."""
    trained = train(tmp_path / "run")
    step5 = tmp_path / "run" / "checkpoints" / "step-5"
    saved = load_file(str(step5 / "model.safetensors"))
    trainable = sorted(n for n, p in trained.model.named_parameters() if not p.stop_gradient)
    assert sorted(saved) == trainable and len(saved) == 8 and all("lora_" in n for n in saved)
    with open(step5 / "trainer.json", encoding="utf-8") as f:
        base = json.load(f)["frozen_base"]
    frozen = [p for p in trained.model.parameters() if p.stop_gradient]
    assert (base["tensors"], base["elements"]) == (len(frozen), sum(int(np.prod(p.shape)) for p in frozen))
    shown = " ".join(describe_checkpoint(str(step5)).split())  # ptrain inspect's text, its wrapping undone
    assert "model: 8 tensors, 1,024 values" in shown and "frozen base: not saved here (21 tensors, 24,736 values" in shown
    with pytest.raises(ConfigError, match=r"^resume: the frozen base model's weights differ from those checkpoint"):
        train(tmp_path / "run", resume=str(step5), model=lora_llama(nudge=1e-3))
    with pytest.raises(ConfigError, match=r"^resume: checkpoint .* holds the LoRA adapter without its frozen base, "
                                          r"which had 21 tensors of 24,736 values; this model's base has 21 of 24,800"):
        train(tmp_path / "run", resume=str(step5), model=lora_llama(vocab_size=65))


def test_load_weights_puts_the_adapter_on_the_base_the_script_built(tmp_path):
    """``load_weights`` (what an export from a checkpoint starts from) of a LoRA checkpoint: the adapter's tensors
    onto the LoRA model the script built on the same base; the whole model then equals the trained one at that
    step. Onto another base: refused."""
    full = train(tmp_path / "full")
    model = lora_llama()
    load_weights(model, str(tmp_path / "full" / "checkpoints" / "step-12"))
    for (name, a), b in zip(full.model.state_dict().items(), model.state_dict().values()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
    step12 = str(tmp_path / "full" / "checkpoints" / "step-12")
    with pytest.raises(ConfigError, match=r"^load_weights: the frozen base model's weights differ.* before load_weights$"):
        load_weights(lora_llama(nudge=1e-3), step12)
    with pytest.raises(DataError, match=r"it holds a LoRA adapter: wrap the base model in the LoRAModel the run "
                                        r"trained \(its LoRAConfig\) first$"):
        load_weights(base_llama(), step12)  # the bare base: the adapter has nowhere to go


def test_load_best_model_at_end_puts_the_best_checkpoints_adapter_into_a_lora_model(tmp_path):
    """``load_best_model_at_end`` with a LoRA model: the best checkpoint's adapter ends in the model (through the
    inner model: ``LoRAModel.set_state_dict`` would skip every tensor and leave the last step's weights), the
    frozen base untouched."""
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=12, logging_steps=1,
                             learning_rate=5e-2, save_steps=4, evaluation_strategy="steps", eval_steps=4,
                             load_best_model_at_end=True, metric_for_best_model="eval_loss",
                             greater_is_better=True, report_to=[])  # the worst loss "best": an early step
    trainer = Trainer(lora_llama(), args, train_dataset=Tokens(), eval_dataset=Tokens())
    before = {k: v.numpy() for k, v in trainer.model.state_dict().items() if "lora_" not in k}
    trainer.fit()
    best = trainer.state.best_checkpoint
    assert best and not best.endswith("step-12"), best  # not the last step: the test would show nothing
    saved = load_file(os.path.join(best, "model.safetensors"))
    now = trainer.model.state_dict()
    for k, v in saved.items():
        np.testing.assert_array_equal(now[k].numpy(), v, err_msg=k)
    for k, v in before.items():
        np.testing.assert_array_equal(now[k].numpy(), v, err_msg=k)


def test_two_ranks_sharding_stage1_save_the_adapter_in_shards_and_resume_bitwise(tmp_path):
    """Sharding stage 1 on 2 processes (each rank writes its shard): the shards hold the 8 LoRA tensors and their
    moments, no frozen weight, and the run resumed at step 5 logs the uninterrupted run's losses and ends with
    its parameters, to the bit."""
    # imported here: this file is also the ranks' script, and tests/ is not on a rank's path
    from helpers import launch
    from patience import patience

    out = tmp_path / "run"
    for name, resume in (("full", ""), ("resumed", str(out / "checkpoints" / "step-5"))):
        launch(__file__, [out, name, resume], nproc=2, log_dir=str(tmp_path / f"logs-{name}"), timeout=patience(300),
               before_retry=None if resume else (lambda: shutil.rmtree(out, ignore_errors=True)))
    with open(out / "checkpoints" / "step-5" / "manifest.json", encoding="utf-8") as f:
        manifest = json.load(f)
    model = sorted(k for k in manifest["tensors"] if k.startswith("model/"))
    assert len(model) == 8 and all("lora_" in k for k in model)
    assert len({part["file"] for t in manifest["tensors"].values() for part in t["parts"]}) == 2  # a shard a rank
    (full, full_params), (resumed, resumed_params) = (
        (json.loads((out / f"{n}.json").read_text()), np.load(out / f"{n}.npz")) for n in ("full", "resumed"))
    assert len(full) == 12 and resumed == full
    for k in full_params.files:
        np.testing.assert_array_equal(resumed_params[k], full_params[k], err_msg=k)


if __name__ == "__main__":  # a rank of test_two_ranks_sharding_stage1_save_the_adapter_in_shards_and_resume_bitwise
    out, name, resume = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""
    trained = train(out, resume=resume or None, sharding="stage1")
    if trained.is_main_process:
        with open(os.path.join(out, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump([[r["step"], r["loss"]] for r in trained.state.log_history if "loss" in r], f)
        np.savez(os.path.join(out, f"{name}.npz"), **{k: v.numpy() for k, v in trained.model.state_dict().items()})
