"""models.splits: scikit-learn's stratified split, bitwise, from a cache a later process reads
without importing scikit-learn; the digits come from scikit-learn's own file."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO
from patience import patience

from models import splits
from models.digits.data import digits_arrays, load_splits


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_digits_are_load_digits_and_the_split_is_train_test_split_bitwise_on_miss_and_hit(cache):
    # imported here, not at collection, where every worker of the suite would pay for scikit-learn
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    pixels, labels = digits_arrays()
    assert np.array_equal(pixels, digits.data) and np.array_equal(labels, digits.target)
    x, y = digits.data.astype("float32") / 16.0, digits.target.astype("int64")
    x_rest, x_test, y_rest, y_test = train_test_split(x, y, test_size=0.15, random_state=7, stratify=y)
    x_train, x_val, y_train, y_val = train_test_split(x_rest, y_rest, test_size=0.15 / 0.85, random_state=7,
                                                      stratify=y_rest)
    for attempt in ("miss", "hit"):
        train, val, test = load_splits(seed=7)
        for got, want in ((train.x, x_train), (train.y, y_train), (val.x, x_val), (val.y, y_val),
                          (test.x, x_test), (test.y, y_test)):
            assert np.array_equal(got, want), attempt
        assert len(list(cache.glob("split-*.npz"))) == 1
    load_splits(seed=8)  # another seed: another entry
    assert len(list(cache.glob("split-*.npz"))) == 2


def test_a_damaged_or_unwritable_cache_is_split_again(cache):
    labels = np.repeat(np.arange(4), 10)
    want = splits.stratified_split(labels, 0.2, 0.2, 0)
    entry = next(cache.glob("split-*.npz"))
    entry.write_bytes(b"not an npz")
    assert all(np.array_equal(a, b) for a, b in zip(splits.stratified_split(labels, 0.2, 0.2, 0), want))
    os.chmod(cache, stat.S_IRUSR | stat.S_IXUSR)  # read-only
    try:
        got = splits.stratified_split(labels, 0.25, 0.0, 1)  # not cached, cannot be: still split
        assert len(got[2]) == 0 and sorted(np.concatenate(got[:2])) == list(range(40))
    finally:
        os.chmod(cache, stat.S_IRWXU)


def test_a_digits_run_with_a_warm_cache_never_imports_scikit_learn(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, PTRAIN_CACHE_DIR=str(tmp_path / "cache"))
    code = ("import sys; from trainer.cli.commands import main; "
            "code = main(['run', 'digits', '--max_steps', '2', '--output_dir', 'run', '--disable_tqdm', 'true', "
            "'--report_to', 'jsonl', '--save_strategy', 'no']); "
            "print('IMPORTED', sorted(m for m in ('sklearn', 'scipy') if m in sys.modules)); sys.exit(code)")
    lines = []
    for _ in range(2):  # the first run fills the cache, the second reads it
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                             timeout=patience(240), env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        lines.append(next(line for line in out.stdout.splitlines() if line.startswith("IMPORTED")))
    assert lines == ["IMPORTED ['scipy', 'sklearn']", "IMPORTED []"]
