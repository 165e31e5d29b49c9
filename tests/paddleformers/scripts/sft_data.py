"""Inputs of the SFT scripts, made offline: a character-level tokenizer with a chat template (47 tokens, within
the tiny Llama's vocabulary of 64) saved as PaddleFormers loads it, and chat files in the ``messages`` format."""

import json
import os
import random

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 .,?!:\n")
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}{{ 'u:' + m['content'] + '\n' }}"
            "{% elif m['role'] == 'assistant' %}{{ 'a:' + m['content'] + eos_token }}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}{{ 'a:' }}{% endif %}")
WORDS = ["cat", "dog", "sun", "red", "blue", "tree", "fish", "bird", "rain", "snow", "hot", "cold", "yes", "no"]


def make_tokenizer(folder: str) -> str:
    """A character-level ``PreTrainedTokenizerFast`` saved in ``folder`` (returned)."""
    from paddleformers.transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(SPECIAL + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>", chat_template=TEMPLATE).save_pretrained(folder)
    return folder


def chats(n: int, seed: int) -> list:
    """``n`` one- or two-turn conversations of 1 to 4 words a message (lengths vary, so packing matters)."""
    rng = random.Random(seed)

    def say():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))

    out = []
    for _ in range(n):
        messages = []
        for _ in range(rng.randint(1, 2)):
            messages += [{"role": "user", "content": say()}, {"role": "assistant", "content": say()}]
        out.append({"messages": messages})
    return out


def write_chats(path: str, n: int, seed: int) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for chat in chats(n, seed):
            f.write(json.dumps(chat) + "\n")
    return path


def make_model_dir(folder: str, max_seq_len: int = 128) -> str:
    """A tiny random Llama and the tokenizer saved together, as ``model_name_or_path`` of a CLI config."""
    import paddle
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

    paddle.seed(1)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=max_seq_len,
                         fuse_rms_norm=False, architectures=["LlamaForCausalLM"])
    LlamaForCausalLM(config).save_pretrained(folder)
    return make_tokenizer(folder)


CONFIG = """\
train_dataset_type: messages
train_dataset_path: {folder}/train.jsonl
train_dataset_prob: "1.0"
eval_dataset_type: messages
eval_dataset_path: {folder}/eval.jsonl
eval_dataset_prob: "1.0"
max_seq_len: 128
packing: true
greedy_intokens: true
binpacking: false
packing_interval: 16
template_backend: jinja
model_name_or_path: {folder}/model
continue_training: {continue_training}
_attn_implementation: eager
use_attn_mask_startend_row_indices: false
lora: true
lora_rank: 4
stage: SFT
seed: 7
do_train: true
per_device_train_batch_size: 2
max_steps: 6
logging_steps: 1
learning_rate: 1.0e-3
warmup_steps: 2
output_dir: {out}
save_strategy: "no"
amp_master_grad: false
sharding: ""
disable_tqdm: true
report_to: {report_to}
device: cpu
"""


def write_config(path: str, folder: str, out: str, continue_training: bool = True, report_to: str = "none",
                 extra: str = "") -> str:
    """``paddleformers-cli train``'s YAML for a LoRA SFT run of the tiny Llama on packed chats (the inputs
    made in ``folder`` by ``make_inputs``)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(CONFIG.format(folder=folder, out=out, continue_training=str(continue_training).lower(),
                              report_to=report_to) + extra)
    return path


def make_inputs(folder: str) -> str:
    make_model_dir(os.path.join(folder, "model"))
    write_chats(os.path.join(folder, "train.jsonl"), n=48, seed=0)
    write_chats(os.path.join(folder, "eval.jsonl"), n=8, seed=1)
    return folder


if __name__ == "__main__":  # python sft_data.py FOLDER: the CLI's inputs
    import sys

    print(make_inputs(sys.argv[1]))
