"""The ERNIE classifier: paddlenlp's ``ErnieForSequenceClassification``.

``model_name_or_path`` picks it:

* a preset name: a small ERNIE built from an ``ErnieConfig`` and trained from
  scratch on the character vocabulary: ``tiny`` (2 layers, hidden 64, 4 heads,
  the demo's) or ``mini`` (2 layers, hidden 128, 4 heads);
* a local directory written by ``save_pretrained`` (config.json +
  model_state.pdparams + vocab.txt): loaded with ``from_pretrained``;
* a paddlenlp model name (``ernie-1.0``, ``ernie-3.0-medium-zh``, ...): fetched by
  ``from_pretrained`` into ``~/.paddlenlp/models`` when the network allows.
  Offline, paddlenlp raises at once (no long wait); we turn that into a one-line
  ConfigError saying how to pass a local directory instead.

    >>> sorted(PRESETS)
    ['mini', 'tiny']
"""

from __future__ import annotations

import os
from typing import Optional

from trainer.errors import ConfigError

# From-scratch shapes for a CPU. ``tiny`` is the demo's: see recipes/demo.yaml for what it reaches.
# initializer_range: paddlenlp's default 0.02 suits hidden 768; a narrow model trained from scratch
# leaves its first loss plateau far sooner with initial weights nearer 1/sqrt(hidden).
PRESETS = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
                 initializer_range=0.1),
    "mini": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                 initializer_range=0.08),
}


def is_preset(name: str) -> bool:
    return name in PRESETS


def scratch_config(preset: str, vocab_size: int, num_labels: int, max_position: int, dropout: float,
                   overrides: Optional[dict] = None):
    """An ``ErnieConfig`` for a preset, with ``overrides`` (non-None values) applied."""
    from paddlenlp.transformers import ErnieConfig

    shape = dict(PRESETS[preset])
    shape.update({k: v for k, v in (overrides or {}).items() if v})
    if shape["hidden_size"] % shape["num_attention_heads"]:
        raise ConfigError(f"hidden_size={shape['hidden_size']} is not a multiple of "
                          f"num_attention_heads={shape['num_attention_heads']}: change one of them")
    return ErnieConfig(vocab_size=vocab_size, max_position_embeddings=max_position, type_vocab_size=2,
                       num_labels=num_labels, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                       pad_token_id=0, **shape)


def build_scratch_model(config, tensor_parallel_degree: int = 1):
    """paddlenlp's ``ErnieForSequenceClassification``; with ``tensor_parallel_degree`` > 1 the same shape as
    ``models/ernie/parallel_model.py``'s tensor-parallel encoder (paddlenlp 2.8.1's ERNIE has no tensor parallel),
    its vocabulary padded to a multiple of the degree (VocabParallelEmbedding splits it evenly)."""
    if tensor_parallel_degree > 1:
        return build_parallel_model(config, tensor_parallel_degree)
    from paddlenlp.transformers import ErnieForSequenceClassification

    return ErnieForSequenceClassification(config)


def build_parallel_model(config, degree: int):
    from .parallel_model import ErnieTPConfig, ErnieTPForSequenceClassification

    for name in ("num_attention_heads", "intermediate_size"):
        if getattr(config, name) % degree:
            raise ConfigError(f"{name}={getattr(config, name)} does not split over tensor_parallel_degree={degree}: "
                              f"choose a multiple of {degree}")
    vocab = -(-config.vocab_size // degree) * degree
    return ErnieTPForSequenceClassification(ErnieTPConfig(
        vocab_size=vocab, hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads, intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings, type_vocab_size=config.type_vocab_size,
        num_labels=config.num_labels, hidden_dropout_prob=config.hidden_dropout_prob,
        attention_probs_dropout_prob=config.attention_probs_dropout_prob, pad_token_id=config.pad_token_id,
        tensor_parallel_degree=degree))


def load_pretrained_tokenizer(name_or_path: str):
    """``ErnieTokenizer.from_pretrained`` with a one-line error (tried first: it fails fastest offline)."""
    from paddlenlp.transformers import ErnieTokenizer

    try:
        return ErnieTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError, RuntimeError, AssertionError) as exc:  # paddlenlp asserts on a folder without vocab
        raise ConfigError(pretrained_error(name_or_path, exc)) from None


def load_pretrained_model(name_or_path: str, num_labels: int, dropout: Optional[float] = None):
    """``ErnieForSequenceClassification.from_pretrained`` (new classifier head) with a one-line error."""
    from paddlenlp.transformers import ErnieForSequenceClassification

    kwargs = {"num_labels": num_labels}
    if dropout is not None:
        kwargs["classifier_dropout"] = dropout
    try:
        return ErnieForSequenceClassification.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError, RuntimeError, AssertionError) as exc:
        raise ConfigError(pretrained_error(name_or_path, exc)) from None


def pretrained_error(name_or_path: str, exc: BaseException) -> str:
    if os.path.isdir(name_or_path):
        return (f"model_name_or_path={name_or_path!r}: the directory does not hold an ERNIE model "
                "(config.json, model_state.pdparams, vocab.txt): write one with model.save_pretrained(DIR) "
                "and tokenizer.save_pretrained(DIR)")
    if os.path.sep in name_or_path or name_or_path.startswith("."):
        return f"model_name_or_path={name_or_path!r} does not exist: give an existing directory or a model name"
    return (f"model_name_or_path={name_or_path!r} could not be fetched (no network?): where there is network, save it "
            f"with ErnieForSequenceClassification.from_pretrained('{name_or_path}').save_pretrained(DIR) and the same "
            f"with ErnieTokenizer, copy DIR here and pass --model_name_or_path DIR (or train a from-scratch preset: "
            f"{', '.join(PRESETS)})")


def parameter_count(model) -> int:
    import numpy as np

    return int(sum(int(np.prod(p.shape)) for p in model.parameters()))
