"""A PaddleNLP ``LoRAModel`` (paddlenlp.peft) resumes bitwise, as PaddleFormers' does (tests/paddleformers/).

Its ``set_state_dict`` takes the inner model's names and skips every other key without a word: a resume through
it restored nothing and the resumed run's losses drifted from step 6 (``trainer.layout.adapters.set_state``).
"""

import json

import numpy as np
import paddle
from paddlenlp.peft import LoRAConfig, LoRAModel
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

from trainer import Trainer, TrainingArguments


def lora_llama() -> LoRAModel:
    paddle.seed(1)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64))
    return LoRAModel(base, LoRAConfig(target_modules=[".*q_proj", ".*v_proj"], r=4, lora_alpha=8, lora_dropout=0.1))


class Tokens(paddle.io.Dataset):
    def __init__(self):
        self.x = np.random.RandomState(0).randint(0, 64, (32, 16)).astype("int64")

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def train(out, resume=None) -> Trainer:
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=12, logging_steps=1,
                             learning_rate=1e-2, save_steps=5, report_to=[])
    trainer = Trainer(lora_llama(), args, train_dataset=Tokens())
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
