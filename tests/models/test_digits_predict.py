"""``ptrain predict digits``: the exported MLP of a real ``ptrain run digits`` answers array files and images."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from helpers import REPO


def _ptrain(*argv, timeout=600):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "trainer.cli", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    run = _ptrain("run", "digits", "--output_dir", str(out), "--max_steps", "150", "--learning_rate", "0.01")
    assert run.returncode == 0, run.stderr[-3000:]
    return out / "inference"


def test_array_files_and_images_are_classified_as_training_data_is(exported, tmp_path):
    from sklearn.datasets import load_digits

    digits = load_digits()
    picks = [int(np.flatnonzero(digits.target == d)[-1]) for d in range(10)]  # one sample of each digit
    files = []
    for k, i in enumerate(picks):
        image = digits.images[i]
        if k % 3 == 0:
            np.save(tmp_path / f"d{k}.npy", image)  # 8x8, scale 0..16
            files.append(tmp_path / f"d{k}.npy")
        elif k % 3 == 1:
            np.savetxt(tmp_path / f"d{k}.csv", (image / 16).reshape(1, -1), delimiter=",")  # a flat row in 0..1
            files.append(tmp_path / f"d{k}.csv")
        else:  # a 64x64 scan, dark ink on white paper: shrunk and inverted by predict
            big = np.kron(255 - image * 255 / 16, np.ones((8, 8))).astype("uint8")
            Image.fromarray(big).save(tmp_path / f"d{k}.png")
            files.append(tmp_path / f"d{k}.png")
    result = _ptrain("predict", "digits", "--model", str(exported), *map(str, files))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["input"] for r in rows] == list(map(str, files))
    assert all(0 <= r["label"] <= 9 and 0 < r["score"] <= 1 and len(r["top3"]) == 3 for r in rows)
    correct = sum(r["label"] == digits.target[i] for r, i in zip(rows, picks))
    assert correct >= 7, rows  # the demo model scores ~0.9 on held-out digits; chance is 1 in 10

    # the same arrays straight through paddle.inference: predict adds only the reading
    from trainer.deploy.predictor import create_predictor, run_predictor

    (logits,) = run_predictor(create_predictor(str(exported)), [(digits.images[picks] / 16).reshape(10, 64).astype("float32")])
    array_rows = [k for k in range(10) if k % 3 != 2]
    assert [rows[k]["label"] for k in array_rows] == [int(logits[k].argmax()) for k in array_rows]


@pytest.mark.parametrize("content, message", [(b"1,2,3", "holds 3 numbers"), (b"\x00garbage", "cannot be read")])
def test_bad_input_files_are_one_line_data_errors(exported, tmp_path, content, message):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(content)
    result = _ptrain("predict", "digits", "--model", str(exported), str(bad))
    assert result.returncode == 3, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
