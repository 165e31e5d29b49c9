"""Tokenizers for the ERNIE task, and the token-id cache.

From-scratch models use a vocabulary built from the *training split only*
(dev/test texts never shape it): paddlenlp's ``BasicTokenizer`` (lower-case,
one token per CJK character, punctuation split) counts the tokens; every token
seen ``min_freq`` times or more is kept, and every kept multi-character word
(Latin words, numbers) also contributes its characters as word pieces (``c``
and ``##c``), so an unseen word made of known letters is spelled out instead of
becoming ``[UNK]``. The vocabulary is
written as ``vocab.txt`` and read back through paddlenlp's
``ErnieTokenizer(vocab_file=...)``, with the special tokens at fixed ids::

    >>> SPECIAL_TOKENS
    ('[PAD]', '[CLS]', '[SEP]', '[UNK]', '[MASK]')

Pretrained models use their own tokenizer (``ErnieTokenizer.from_pretrained``).

Encoding runs once: token ids are stored in ``CACHE_DIR/<key>.npz`` where the
key hashes the texts, the vocabulary and ``max_seq_len``; a later run with the
same inputs reads the file instead of tokenizing again.
"""

from __future__ import annotations

import collections
import hashlib
import os
import tempfile
from typing import Iterable, List, Sequence, Tuple

import numpy as np

SPECIAL_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]")
VOCAB_FILE = "vocab.txt"
_CACHE_VERSION = "1"


def build_char_vocab(texts: Iterable[str], min_freq: int = 2, max_size: int = 0) -> List[str]:
    """Tokens for ``vocab.txt``: the special tokens, then kept tokens by frequency."""
    from paddlenlp.transformers import BasicTokenizer

    basic = BasicTokenizer(do_lower_case=True)
    counts: collections.Counter = collections.Counter()
    for text in texts:
        counts.update(basic.tokenize(text))
    kept = [tok for tok, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if n >= min_freq]
    if max_size:
        kept = kept[:max(0, max_size - len(SPECIAL_TOKENS))]
    tokens, seen = list(SPECIAL_TOKENS), set(SPECIAL_TOKENS)
    pieces: List[str] = []
    for tok in kept:
        if tok not in seen:
            tokens.append(tok)
            seen.add(tok)
        if len(tok) > 1:  # spell-out pieces of words: each character as a word start and as ##piece
            pieces.extend(tok)
            pieces.extend("##" + ch for ch in tok)
    for piece in pieces:
        if piece not in seen:
            tokens.append(piece)
            seen.add(piece)
    return tokens


def write_vocab(tokens: Sequence[str], path: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    return path


def char_tokenizer(vocab_file: str):
    """paddlenlp's ``ErnieTokenizer`` over a ``vocab.txt`` written by :func:`write_vocab`."""
    from paddlenlp.transformers import ErnieTokenizer

    return ErnieTokenizer(vocab_file=vocab_file, do_lower_case=True)


def encode(tokenizer, texts: Sequence[str], max_seq_len: int) -> List[np.ndarray]:
    """``[CLS] tokens [SEP]`` ids per text, truncated to ``max_seq_len`` in all (int32)."""
    out = []
    for start in range(0, len(texts), 1024):
        batch = tokenizer(list(texts[start:start + 1024]), max_length=max_seq_len, truncation=True,
                          return_token_type_ids=False, return_attention_mask=False)
        out.extend(np.asarray(ids, dtype="int32") for ids in batch["input_ids"])
    return out


def vocab_fingerprint(tokenizer) -> str:
    """A hash of the tokenizer's vocabulary and casing (part of the cache key)."""
    h = hashlib.sha256()
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else tokenizer.vocab.token_to_idx
    for tok, idx in sorted(vocab.items(), key=lambda kv: kv[1]):
        h.update(f"{idx}\t{tok}\n".encode("utf-8"))
    h.update(f"lower={getattr(tokenizer, 'do_lower_case', None)}".encode())
    return h.hexdigest()


def cache_key(texts: Sequence[str], fingerprint: str, max_seq_len: int) -> str:
    h = hashlib.sha256(f"v{_CACHE_VERSION}|{fingerprint}|{max_seq_len}|{len(texts)}|".encode())
    for text in texts:
        h.update(text.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:20]


def char_vocab_cached(texts: Sequence[str], min_freq: int, cache_dir: str, write: bool = True) -> List[str]:
    """:func:`build_char_vocab` through the cache (``vocab-KEY.txt`` in ``cache_dir``, keyed by the
    texts and ``min_freq``): a run over the same training texts does not count them again. With
    ``write=False`` (a dry run) a missing entry is computed and not stored."""
    path = os.path.join(cache_dir, f"vocab-{cache_key(texts, f'chars-min{min_freq}', 0)}.txt")
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                tokens = f.read().split("\n")[:-1]
            if tokens[:len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS):
                return tokens
        except (OSError, UnicodeDecodeError):
            pass  # unreadable: count again and overwrite
    tokens = build_char_vocab(texts, min_freq=min_freq)
    if write:
        write_text_atomic(path, "\n".join(tokens) + "\n")
    return tokens


def write_text_atomic(path: str, text: str) -> None:
    """``text`` to ``path`` through a temporary file and a rename (a reader never sees half of it)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def encode_cached(tokenizer, texts: Sequence[str], max_seq_len: int, cache_dir: str,
                  fingerprint: str = "") -> Tuple[List[np.ndarray], bool]:
    """:func:`encode` through the cache; returns ``(ids, read_from_cache)``.

    The cache file is written to a temporary name and renamed, so an
    interrupted run or a second process never reads a half-written file.
    """
    key = cache_key(texts, fingerprint or vocab_fingerprint(tokenizer), max_seq_len)
    path = os.path.join(cache_dir, f"tokens-{key}.npz")
    if os.path.isfile(path):
        try:
            with np.load(path) as z:
                flat, offsets = z["ids"], z["offsets"]
            if len(offsets) == len(texts) + 1:
                return [flat[offsets[i]:offsets[i + 1]] for i in range(len(texts))], True
        except (OSError, ValueError, KeyError):
            pass  # unreadable: encode again and overwrite
    ids = encode(tokenizer, texts, max_seq_len)
    os.makedirs(cache_dir, exist_ok=True)
    offsets = np.zeros(len(ids) + 1, dtype="int64")
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    flat = np.concatenate(ids) if ids else np.zeros(0, dtype="int32")
    fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".npz.tmp")
    with os.fdopen(fd, "wb") as f:
        np.savez(f, ids=flat, offsets=offsets)
    os.replace(tmp, path)
    return ids, False
