"""Changed data at the same size (issue 39 item 9): the resume line says what the fingerprint compared, and
``--data_fingerprint content`` hashes every training file, so that one changed pixel of an ImageFolder image or
one changed line of ERNIE's training file is refused on resume in one line naming the file (exit 2, as any changed
fingerprint). Real runs through ``ptrain``; the default reads no file's contents (a FIFO among the files would
block it)."""

import json
import logging
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest
from helpers import REPO, ToyDataset, make_mlp
from patience import patience
from PIL import Image

from trainer import ConfigError, Trainer, TrainingArguments
from trainer.checkpoint.fingerprint import (
    CHUNK,
    LISTED_FILES,
    content_fingerprint,
    data_changes,
)

BASE = {"per_device_train_batch_size": 8, "max_steps": 4, "save_steps": 2, "logging_steps": 2, "report_to": [],
        "evaluation_strategy": "no", "save_async": False}
NOT_CHECKED = "(contents not checked; --data_fingerprint content checks them)"
NOT_CHECKED_API = NOT_CHECKED.replace("--data_fingerprint content", 'data_fingerprint="content"')  # as the API spells it


def ptrain(*args, cwd):
    return subprocess.run([sys.executable, "-m", "trainer.cli", "run", *args, "--evaluation_strategy", "no",
                           "--disable_tqdm", "true", "--save_steps", "2", "--output_dir", "run"],
                          check=False, capture_output=True, text=True, cwd=cwd, timeout=patience(600),
                          env=dict(os.environ, PYTHONPATH=REPO))


def error_line(proc):
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("ptrain: error:")]
    return line


def checkpoints(run):
    return sorted(n for n in os.listdir(run / "checkpoints") if n.startswith("step-"))


def test_one_pixel_of_an_imagefolder_image_is_caught_by_the_content_check_only(tmp_path):
    for split in ("train", "val"):
        for k, c in enumerate(("a", "b")):
            os.makedirs(tmp_path / "data" / split / c)
            for i in range(4):  # BMP: a changed pixel keeps the file's size
                pixels = (np.random.RandomState(10 * k + i).rand(40, 48, 3) * 255).astype("uint8")
                Image.fromarray(pixels).save(tmp_path / "data" / split / c / f"{i}.bmp")
    resnet = ["resnet", "--data_dir", "data", "--depth", "18", "--image_size", "32", "--resize_size", "36",
              "--per_device_train_batch_size", "4"]
    first = ptrain(*resnet, "--max_steps", "2", "--data_fingerprint", "content", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    with open(tmp_path / "run" / "checkpoints" / "step-2" / "trainer.json", encoding="utf-8") as f:
        content = json.load(f)["data_fingerprint"]["content"]
    assert content["hash"] == "blake2b-128" and sorted(content["files"]) == [f"{c}/{i}.bmp" for c in "ab" for i in range(4)]

    image = tmp_path / "data" / "train" / "a" / "1.bmp"
    size, pixels = image.stat().st_size, np.array(Image.open(image))
    pixels[5, 5, 0] ^= 1
    Image.fromarray(pixels).save(image)
    assert image.stat().st_size == size

    refused = ptrain(*resnet, "--max_steps", "4", "--resume_from_checkpoint", "auto", "--data_fingerprint", "content",
                     cwd=tmp_path)
    assert refused.returncode == ConfigError.exit_code, refused.stderr[-3000:]
    assert "the training data changed since checkpoint run/checkpoints/step-2 (contents: a/1.bmp differs (1 of 8 " \
           "files))" in error_line(refused)
    assert checkpoints(tmp_path / "run") == ["step-2"]  # refused before training

    # the default compares paths and sizes, and says so (and that contents were not read)
    resumed = ptrain(*resnet, "--max_steps", "4", "--resume_from_checkpoint", "auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"training data: 8 files, paths and sizes match {NOT_CHECKED}" in resumed.stderr
    assert "step-4" in checkpoints(tmp_path / "run")


def test_one_line_of_ernies_training_file_is_caught_by_the_content_check_only(tmp_path):
    rng = np.random.RandomState(0)
    neutral = list("这个东西我们的买了手机书店看用")
    os.makedirs(tmp_path / "data")
    for name, n in (("train", 32), ("dev", 8), ("test", 8)):
        rows = []
        for _ in range(n):
            label = int(rng.randint(2))
            chars = list(rng.choice(neutral, size=rng.randint(4, 12)))
            chars.insert(rng.randint(len(chars)), "很好" if label else "太差")
            rows.append(f"{label}\t{''.join(chars)}\n")
        (tmp_path / "data" / f"{name}.tsv").write_text("label\ttext\n" + "".join(rows), encoding="utf-8")
    ernie = ["ernie", "--data_dir", "data", "--hidden_size", "32", "--num_hidden_layers", "1", "--num_attention_heads",
             "2", "--intermediate_size", "64", "--max_seq_len", "24", "--per_device_train_batch_size", "8"]
    first = ptrain(*ernie, "--max_steps", "2", "--data_fingerprint", "content", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]

    train = tmp_path / "data" / "train.tsv"
    lines = train.read_text(encoding="utf-8").split("\n")
    k = next(i for i, line in enumerate(lines) if "很好" in line)
    lines[k] = lines[k].replace("很好", "很差")  # the same number of bytes: the line now says the opposite
    size = train.stat().st_size
    train.write_text("\n".join(lines), encoding="utf-8")
    assert train.stat().st_size == size

    refused = ptrain(*ernie, "--max_steps", "4", "--resume_from_checkpoint", "auto", "--data_fingerprint", "content",
                     cwd=tmp_path)
    assert refused.returncode == ConfigError.exit_code, refused.stderr[-3000:]
    assert "(contents: train.tsv differs (1 of 1 files))" in error_line(refused)

    resumed = ptrain(*ernie, "--max_steps", "4", "--resume_from_checkpoint", "auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"training data: 1 file, paths and sizes match {NOT_CHECKED}" in resumed.stderr


class Files(ToyDataset):
    """40 samples read from ``paths`` (the data_files hook); the default fingerprint is their paths and sizes."""

    def __init__(self, paths):
        super().__init__(40)
        self.paths = [str(p) for p in paths]

    def data_files(self):
        return self.paths


def fit(out, dataset, **changes):
    args = TrainingArguments(output_dir=str(out), **{**BASE, **changes})
    trainer = Trainer(make_mlp(), args, train_dataset=dataset, loss_fn=paddle.nn.CrossEntropyLoss())
    trainer.fit()
    return trainer


@pytest.mark.timeout(120)
def test_the_default_reads_no_contents_and_says_what_it_compared(tmp_path, caplog):
    """A FIFO among the files: reading it would block the run (no writer), stat-ing it does not."""
    (tmp_path / "rows.bin").write_bytes(b"x" * 100)
    os.mkfifo(tmp_path / "pipe")
    data = Files([tmp_path / "rows.bin", tmp_path / "pipe"])
    fit(tmp_path / "run", data, max_steps=2)
    with open(tmp_path / "run" / "checkpoints" / "step-2" / "trainer.json", encoding="utf-8") as f:
        recorded = json.load(f)["data_fingerprint"]
    assert recorded["files"] == {"rows.bin": 100, "pipe": 0} and "content" not in recorded
    with caplog.at_level(logging.INFO, logger="trainer.resume"):
        assert fit(tmp_path / "run", Files(data.paths), resume_from_checkpoint="auto").state.global_step == 4
    assert f"training data: 2 files, paths and sizes match {NOT_CHECKED_API}" in caplog.text

    (tmp_path / "rows.bin").write_bytes(b"y" * 101)  # another size: refused without reading anything, also when
    with pytest.raises(ConfigError, match=r"\(files: 1 changed \(rows.bin: 100 -> 101\)\)"):  # the same object
        fit(tmp_path / "run", data, resume_from_checkpoint="auto", max_steps=6)  # fingerprinted the old files before


def test_the_content_check_needs_named_files_and_says_when_the_checkpoint_has_no_contents(tmp_path, caplog):
    with pytest.raises(ConfigError, match=r"^data_fingerprint=\"content\": the training dataset \(ToyDataset\) names no "
                                          r"files to hash: give it a data_files\(\) method"):
        fit(tmp_path / "a", ToyDataset(40), data_fingerprint="content")
    assert not (tmp_path / "a" / "checkpoints").exists()  # refused before training

    (tmp_path / "rows.bin").write_bytes(b"x" * 100)
    fit(tmp_path / "b", Files([tmp_path / "rows.bin"]), max_steps=2)
    with caplog.at_level(logging.INFO, logger="trainer.resume"):
        fit(tmp_path / "b", Files([tmp_path / "rows.bin"]), resume_from_checkpoint="auto", data_fingerprint="content")
    assert ("training data: 1 file, paths and sizes match (contents not compared: the checkpoint recorded none; the "
            "checkpoints this run writes record them)") in caplog.text
    with open(tmp_path / "b" / "checkpoints" / "step-4" / "trainer.json", encoding="utf-8") as f:
        assert json.load(f)["data_fingerprint"]["content"]["count"] == 1
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trainer.resume"):
        fit(tmp_path / "b", Files([tmp_path / "rows.bin"]), resume_from_checkpoint="auto", data_fingerprint="content",
            max_steps=6)
    assert "training data: 1 file, paths and sizes match, and their contents too (blake2b-128 of every file)" in caplog.text


def test_above_the_listed_files_a_changed_file_is_named_by_its_group(tmp_path):
    paths = []
    for i in range(LISTED_FILES + 10):
        path = tmp_path / f"{i:05d}.txt"
        path.write_bytes(b"%05d" % i)
        paths.append(str(path))
    before = content_fingerprint(paths)
    (tmp_path / "02345.txt").write_bytes(b"99999")
    after = content_fingerprint(paths)
    assert len(before["files"]) == (LISTED_FILES + 10 + CHUNK - 1) // CHUNK  # a digest per CHUNK files
    assert data_changes({"content": before}, {"content": after}) == (
        f"contents: 1 of 6 groups of {CHUNK} files differ, the first: the files 02000.txt .. 02999.txt (a hash per "
        f"file is recorded for up to {LISTED_FILES:,} files)")
