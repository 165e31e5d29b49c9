"""Helpers of the compatibility tests: a tiny random ERNIE saved with
``save_pretrained`` (no download: the vocabulary is a short list of
characters), a learnable toy text-classification data set, and running the
PaddleNLP-style script with one import line swapped."""

from __future__ import annotations

import json
import os
import runpy
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "text_classification.py")
PADDLENLP_IMPORT = "from paddlenlp.trainer import Trainer\n"
OUR_IMPORT = "from trainer import Trainer\n"

POSITIVE = list("好棒赞美喜乐爱甜")
NEGATIVE = list("坏差烂丑悲苦恨酸")
NEUTRAL = list("的了是在有这个人们我你他她它天地日月山水风雨花草")
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def make_tiny_ernie(path: str, seed: int = 0) -> str:
    """A 2-layer, 32-wide ERNIE with random weights and its tokenizer, saved with save_pretrained."""
    import paddle
    from paddlenlp.transformers import ErnieConfig, ErnieModel, ErnieTokenizer

    os.makedirs(path, exist_ok=True)
    vocab = os.path.join(path, "vocab.txt")
    with open(vocab, "w", encoding="utf-8") as f:
        f.write("\n".join(SPECIAL + POSITIVE + NEGATIVE + NEUTRAL) + "\n")
    paddle.seed(seed)
    config = ErnieConfig(vocab_size=len(SPECIAL + POSITIVE + NEGATIVE + NEUTRAL), hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
                         pad_token_id=0)
    ErnieModel(config).save_pretrained(path)
    ErnieTokenizer(vocab).save_pretrained(path)
    return path


def write_data(path: str, n_train: int = 384, n_dev: int = 96, n_test: int = 32, seed: int = 0) -> str:
    """jsonl files: a sentence of neutral characters with three sentiment characters; label 1 = positive."""
    rng = np.random.RandomState(seed)
    os.makedirs(path, exist_ok=True)
    for split, n in (("train", n_train), ("dev", n_dev), ("test", n_test)):
        with open(os.path.join(path, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            for _ in range(n):
                label = int(rng.randint(2))
                words = list(rng.choice(NEUTRAL, size=rng.randint(2, 6)))
                for _ in range(3):
                    words.insert(rng.randint(len(words) + 1), rng.choice(POSITIVE if label else NEGATIVE))
                f.write(json.dumps({"sentence": "".join(words), "label": label}, ensure_ascii=False) + "\n")
    return path


ARGS_IMPORT = "from paddlenlp.trainer import EarlyStoppingCallback, PdArgumentParser, TrainerCallback, TrainingArguments\n"
OUR_ARGS_IMPORT = ("from paddlenlp.trainer import EarlyStoppingCallback, PdArgumentParser, TrainerCallback\n"
                   "from trainer import TrainingArguments\n")


def script_source(ours: bool, our_arguments: bool = False, script: str = SCRIPT) -> str:
    """The script; with ``ours`` the Trainer import swapped; with ``our_arguments`` TrainingArguments' too."""
    with open(script, encoding="utf-8") as f:
        text = f.read()
    assert text.count(PADDLENLP_IMPORT) == 1
    if our_arguments:
        assert text.count(ARGS_IMPORT) == 1
        text = text.replace(ARGS_IMPORT, OUR_ARGS_IMPORT)
    return text.replace(PADDLENLP_IMPORT, OUR_IMPORT) if ours else text


def only_the_import_differs(script: str) -> list:
    """The lines that differ between the script as written and with our Trainer's import."""
    import difflib

    theirs, ours = script_source(False, script=script), script_source(True, script=script)
    return [line for line in difflib.unified_diff(theirs.splitlines(True), ours.splitlines(True), n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def write_tagging_data(path: str, n_train: int = 320, n_dev: int = 45, n_test: int = 37, seed: int = 0) -> str:
    """jsonl files of characters and BIO tags: neutral characters with one to three spans of one or two
    sentiment characters (B-POS I-POS, B-NEG I-NEG). Sentences are 3 to 20 characters long, so a collator
    that pads each batch to its own longest gives batches of different lengths."""
    rng = np.random.RandomState(seed)
    os.makedirs(path, exist_ok=True)
    for split, n in (("train", n_train), ("dev", n_dev), ("test", n_test)):
        with open(os.path.join(path, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            for _ in range(n):
                chars, tags = [], []
                for _ in range(rng.randint(1, 4)):
                    for c in rng.choice(NEUTRAL, size=rng.randint(1, 5)):
                        chars.append(str(c))
                        tags.append("O")
                    kind = "POS" if rng.randint(2) else "NEG"
                    for k in range(rng.randint(1, 3)):
                        chars.append(str(rng.choice(POSITIVE if kind == "POS" else NEGATIVE)))
                        tags.append(("B-" if k == 0 else "I-") + kind)
                f.write(json.dumps({"chars": chars[:20], "tags": tags[:20]}, ensure_ascii=False) + "\n")
    return path


def run_script(source: str, argv: list, workdir: str, name: str) -> dict:
    """Run a script text in this process (paddlenlp is imported once for all runs); return its summary.json."""
    path = os.path.join(workdir, name + ".py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    old_argv = sys.argv
    sys.argv = [path] + [str(a) for a in argv]
    try:
        runpy.run_path(path, run_name="__main__")
    finally:
        sys.argv = old_argv
    out = argv[argv.index("--output_dir") + 1]
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        return json.load(f)
