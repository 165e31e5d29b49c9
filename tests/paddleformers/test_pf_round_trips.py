"""Checkpoints between PaddleFormers and us, both ways (issue 43's round trips).

Ours -> PaddleFormers: what our ``save_model`` writes for a PaddleFormers model (a full fine-tune) loads with
``LlamaForCausalLM.from_pretrained`` and gives the trained model's logits (LoRA adapters: test_pf_lora.py).
PaddleFormers -> ours: a checkpoint of PaddleFormers' own Trainer (``save_checkpoint_format="unified_checkpoint"``,
the one that resumes on CPU) given to our resume is refused in one line naming why (its trainer state, RNG and
arguments are pickles; nothing verifies it), and its weights are our starting point through ``from_pretrained``.
"""

import os
import sys

import numpy as np
import pytest
from paddleformers.trainer import Trainer as PFTrainer
from paddleformers.trainer import TrainerCallback
from paddleformers.trainer import TrainingArguments as PFArguments
from paddleformers.transformers import LlamaForCausalLM

from trainer import DataError, Trainer, TrainingArguments

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_pf_lora import Tokens, logits, tiny_llama  # noqa: E402 - the tiny Llama, its tokens, its logits


def ours(out, model, max_steps=6, resume=None) -> Trainer:
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=max_steps,
                             logging_steps=1, learning_rate=1e-3, save_strategy="no", report_to=[])
    trainer = Trainer(model, args, train_dataset=Tokens())
    trainer.fit(resume_from_checkpoint=resume)
    return trainer


def test_a_full_fine_tune_saved_by_us_loads_with_from_pretrained(tmp_path):
    trainer = ours(tmp_path / "run", tiny_llama())
    saved = trainer.save_model(str(tmp_path / "model"))
    assert "config.json" in os.listdir(saved)
    loaded = LlamaForCausalLM.from_pretrained(saved)
    ids = Tokens().x[:3]
    trained = logits(trainer.model, ids)
    assert not np.array_equal(logits(tiny_llama(), ids), trained)  # it trained: equal logits mean it loaded
    np.testing.assert_array_equal(logits(loaded, ids), trained)


@pytest.fixture(scope="module")
def paddleformers_checkpoint(tmp_path_factory):
    """PaddleFormers' own Trainer, 6 steps, a unified checkpoint at step 3 (its CPU settings: the issue)."""
    out = tmp_path_factory.mktemp("pf")
    args = PFArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=6, logging_steps=1,
                       learning_rate=1e-3, amp_master_grad=False, sharding="", save_strategy="steps", save_steps=3,
                       save_checkpoint_format="unified_checkpoint", report_to=[], disable_tqdm=True, seed=7)
    seen = {}

    class AtSave(TrainerCallback):  # the logits of its model as it saves step 3
        def on_save(self, args, state, control, model=None, **kwargs):
            seen.setdefault(state.global_step, logits(model, Tokens().x[:3]))
            model.train()

    PFTrainer(model=tiny_llama(), args=args, train_dataset=Tokens(), callbacks=[AtSave()]).train()
    return out / "checkpoint-3", seen[3]


def test_our_resume_refuses_a_paddleformers_checkpoint_in_one_line(paddleformers_checkpoint, tmp_path):
    checkpoint, _ = paddleformers_checkpoint
    with pytest.raises(DataError) as refused:
        ours(tmp_path, tiny_llama(), resume=str(checkpoint))
    text = str(refused.value)
    assert "\n" not in text
    assert text.startswith(f"{checkpoint} is a PaddleFormers/PaddleNLP Trainer checkpoint (")
    assert "training_args.bin" in text and "pickles, which are never loaded" in text
    assert f"from_pretrained('{checkpoint}')" in text
    assert not os.path.exists(tmp_path / "checkpoints")  # nothing trained, nothing written


def test_a_paddleformers_checkpoint_is_our_starting_point_through_from_pretrained(paddleformers_checkpoint, tmp_path):
    checkpoint, at_step_3 = paddleformers_checkpoint
    model = LlamaForCausalLM.from_pretrained(str(checkpoint))
    np.testing.assert_array_equal(logits(model, Tokens().x[:3]), at_step_3)  # its Trainer's model at step 3
    trainer = ours(tmp_path, model, max_steps=3)
    assert trainer.state.global_step == 3 and np.isfinite(trainer.state.log_history[-1]["loss"])
