"""ERNIE task tokenization: the character vocabulary through ErnieTokenizer, the id cache,
per-batch padding and length bucketing."""

from __future__ import annotations

import numpy as np
import pytest

from models.ernie.batching import TokenDataset, bucketed_order, collate
from models.ernie.tokenizer import SPECIAL_TOKENS, build_char_vocab, char_tokenizer, encode, encode_cached, write_vocab
from trainer.data import ResumableDistributedBatchSampler

TEXTS = ["这个手机很好用", "质量太差了，很失望", "很好很好，推荐购买", "电池不错 iphone 好用", "差评，iphone 太贵"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    write_vocab(build_char_vocab(TEXTS, min_freq=1), str(path))
    return char_tokenizer(str(path))


def test_vocab_round_trip_through_ernie_tokenizer(tokenizer):
    vocab = tokenizer.vocab.token_to_idx
    assert [vocab[t] for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.unk_token_id,
            tokenizer.mask_token_id) == (0, 1, 2, 3, 4)
    ids = encode(tokenizer, ["这个手机很好用"], max_seq_len=32)[0]
    tokens = tokenizer.convert_ids_to_tokens(ids.tolist())
    assert tokens == ["[CLS]", "这", "个", "手", "机", "很", "好", "用", "[SEP]"]
    assert ids.dtype == np.int32
    # an unseen character is [UNK]; a Latin word is kept whole, an unseen one is spelled out with pieces
    assert tokenizer.tokenize("好猫") == ["好", "[UNK]"]
    assert tokenizer.tokenize("iphone") == ["iphone"]
    assert tokenizer.tokenize("phone") == ["p", "##h", "##o", "##n", "##e"]


def test_vocab_keeps_tokens_by_frequency():
    tokens = build_char_vocab(["好好好差", "好差坏"], min_freq=2)
    assert tokens[:len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    assert tokens[len(SPECIAL_TOKENS):] == ["好", "差"]  # 坏 was seen once


def test_truncation_keeps_cls_and_sep(tokenizer):
    ids = encode(tokenizer, ["很好" * 50], max_seq_len=10)[0]
    assert len(ids) == 10 and ids[0] == 1 and ids[-1] == 2


def test_encode_cached_reads_back_the_same_ids(tokenizer, tmp_path):
    first, hit = encode_cached(tokenizer, TEXTS, 16, str(tmp_path))
    again, hit2 = encode_cached(tokenizer, TEXTS, 16, str(tmp_path))
    assert (hit, hit2) == (False, True)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    _, other = encode_cached(tokenizer, TEXTS, 8, str(tmp_path))  # another max_seq_len: another key
    assert other is False and len(list(tmp_path.glob("tokens-*.npz"))) == 2


def test_collate_pads_to_the_longest_in_the_batch():
    ds = TokenDataset([np.array([1, 5, 6, 2], "int32"), np.array([1, 7, 2], "int32")], [1, 0])
    batch = collate([ds[0], ds[1]])
    assert batch["input_ids"].numpy().tolist() == [[1, 5, 6, 2], [1, 7, 2, 0]]
    assert batch["token_type_ids"].numpy().tolist() == [[0, 0, 0, 0], [0, 0, 0, 0]]
    assert batch["labels"].numpy().tolist() == [1, 0]
    assert str(batch["input_ids"].dtype) == "paddle.int64"


@pytest.mark.parametrize("world,n", [(1, 203), (2, 203), (3, 100)])
def test_bucketing_keeps_each_rank_samples_and_cuts_padding(world, n):
    rng = np.random.RandomState(0)
    lengths = rng.randint(3, 120, size=n)
    bs, served_all = 8, []
    for rank in range(world):
        sampler = ResumableDistributedBatchSampler(n, bs, num_replicas=world, rank=rank, seed=0)
        sampler.set_epoch(3)
        batches = list(sampler)
        local = [i for b in batches for i in b]
        order = bucketed_order(local, lengths, bs, chunk_batches=4, rng=np.random.RandomState(rank))
        assert sorted(order.tolist()) == list(range(n))  # a permutation of the dataset
        served = [[int(order[i]) for i in b] for b in batches]
        assert sorted(i for b in served for i in b) == sorted(local)  # the rank's own samples, each once
        padded = sum(len(b) * max(lengths[b]) for b in batches)
        bucketed = sum(len(b) * max(lengths[b]) for b in served)
        assert bucketed < 0.8 * padded
        served_all += [i for b in served for i in b]
    assert set(served_all) == set(range(n))


@pytest.mark.parametrize("module", ["batching", "metrics", "model", "pretrain", "tokenizer"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"models.ernie.{module}"))
    assert result.failed == 0 and result.attempted > 0


def test_masking_collator_hides_only_ordinary_tokens():
    from models.ernie.pretrain import MASK_ID, MaskingCollator

    items = [(np.array([1] + list(range(5, 45)) + [2], "int32"), 0), (np.array([1, 9, 2], "int32"), 1)]
    batch = MaskingCollator(vocab_size=60, mask_prob=0.3, seed=1)(items, as_tensors=False)
    flat = batch["input_ids"].reshape(-1)
    original = np.zeros((2, 42), "int64")
    original[0, :42], original[1, :3] = items[0][0], items[1][0]
    positions = batch["masked_positions"]
    assert np.array_equal(batch["labels"], original.reshape(-1)[positions])  # targets are the original tokens
    assert (original.reshape(-1)[positions] >= 5).all()  # never [PAD] [CLS] [SEP] [UNK] [MASK]
    assert (flat[positions] == MASK_ID).mean() > 0.5
    untouched = np.setdiff1d(np.arange(flat.size), positions)
    assert np.array_equal(flat[untouched], original.reshape(-1)[untouched])


def test_the_vocabulary_cache_gives_the_counted_vocabulary_and_a_dry_run_writes_none(tmp_path):
    from models.ernie.tokenizer import char_vocab_cached

    counted = build_char_vocab(TEXTS, min_freq=1)
    assert char_vocab_cached(TEXTS, 1, str(tmp_path / "dry"), write=False) == counted
    assert not (tmp_path / "dry").exists()  # a dry run stores nothing
    assert char_vocab_cached(TEXTS, 1, str(tmp_path)) == counted
    cached = list(tmp_path.glob("vocab-*.txt"))
    assert len(cached) == 1
    cached[0].write_text("[PAD]\n[CLS]\n[SEP]\n[UNK]\n[MASK]\n好\n", encoding="utf-8")  # what a cache entry is read as
    assert char_vocab_cached(TEXTS, 1, str(tmp_path)) == list(SPECIAL_TOKENS) + ["好"]
    cached[0].write_text("garbage\n", encoding="utf-8")  # not a vocabulary: counted again, rewritten
    assert char_vocab_cached(TEXTS, 1, str(tmp_path)) == counted and cached[0].read_text(encoding="utf-8").split() == counted
    assert char_vocab_cached(TEXTS, 2, str(tmp_path)) == build_char_vocab(TEXTS, min_freq=2)  # another key
    assert len(list(tmp_path.glob("vocab-*.txt"))) == 2
