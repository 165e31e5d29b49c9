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
