"""The training data's fingerprint (issue 32, item 2): each checkpoint records it; a resume over changed data
of the same size is refused in one line naming what changed (exit 2), and resumes on purpose with
resume_allow_data_change. Real training: a map-style dataset with the ``fingerprint`` hook through the Python
API, and an ImageFolder with one image removed and another added (same count) through ``ptrain``."""

import json
import logging
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest
from helpers import REPO, ToyDataset, make_mlp
from PIL import Image

from trainer import ConfigError, Trainer, TrainingArguments
from trainer.checkpoint.fingerprint import data_changes, data_fingerprint
from trainer.errors import DataError

BASE = dict(per_device_train_batch_size=8, max_steps=8, save_steps=4, logging_steps=4, report_to=[],
            evaluation_strategy="no", save_async=False)


class Versioned(ToyDataset):
    """A map-style dataset whose content is named by a version string (the documented hook)."""

    def __init__(self, version, n=40):
        super().__init__(n)
        self.version = version

    def fingerprint(self):
        return {"version": self.version, "rows": {"all": self.version}}


def fit(out, dataset, **changes):
    args = TrainingArguments(output_dir=str(out), **{**BASE, **changes})
    t = Trainer(make_mlp(), args, train_dataset=dataset, loss_fn=paddle.nn.CrossEntropyLoss())
    t.fit()
    return t


def meta(path):
    with open(os.path.join(path, "trainer.json"), encoding="utf-8") as f:
        return json.load(f)


def test_the_hook_is_recorded_and_a_changed_fingerprint_is_refused_unless_allowed(tmp_path, caplog):
    fit(tmp_path, Versioned("v1"), max_steps=4)
    step4 = str(tmp_path / "checkpoints" / "step-4")
    assert meta(step4)["data_fingerprint"] == {"version": "v1", "rows": {"all": "v1"}}
    with pytest.raises(ConfigError) as refused:
        fit(tmp_path, Versioned("v2"), resume_from_checkpoint=step4)
    line = str(refused.value)
    assert "\n" not in line and refused.value.exit_code == 2
    assert f"the training data changed since checkpoint {step4} (rows: 1 changed (all: v1 -> v2))" in line, line
    assert 'resume_allow_data_change=True' in line
    assert "step-8" not in os.listdir(tmp_path / "checkpoints")  # refused before training
    with caplog.at_level(logging.WARNING, logger="trainer.resume"):
        t = fit(tmp_path, Versioned("v2"), resume_from_checkpoint=step4, resume_allow_data_change=True)
    assert t.state.global_step == 8
    assert any("training data changed" in r.getMessage() and "resuming anyway" in r.getMessage() for r in caplog.records)
    assert meta(str(tmp_path / "checkpoints" / "step-8"))["data_fingerprint"]["version"] == "v2"  # the new data's


def test_the_same_data_resumes_and_a_dataset_without_the_hook_is_checked_by_length_only(tmp_path):
    fit(tmp_path / "a", Versioned("v1"), max_steps=4)
    assert fit(tmp_path / "a", Versioned("v1"), resume_from_checkpoint="auto").state.global_step == 8
    fit(tmp_path / "b", ToyDataset(40), max_steps=4)
    assert meta(str(tmp_path / "b" / "checkpoints" / "step-4"))["data_fingerprint"] is None
    assert fit(tmp_path / "b", ToyDataset(40, seed=1), resume_from_checkpoint="auto").state.global_step == 8


def test_fingerprints_compare_by_their_finest_mapping_and_a_bad_hook_is_one_line():
    old = {"digest": "1", "class folders": {"a": "2 files, x"}, "files": {"a/x.jpg": 10, "a/z.jpg": 5}}
    new = {"digest": "2", "class folders": {"a": "2 files, y"}, "files": {"a/y.jpg": 12, "a/z.jpg": 6}}
    assert data_changes(old, new) == "files: 1 removed (a/x.jpg), 1 added (a/y.jpg), 1 changed (a/z.jpg: 5 -> 6)"
    big_old, big_new = dict(old, files={}), dict(new, files={})
    assert data_changes(big_old, big_new) == "class folders: 1 changed (a: 2 files, x -> 2 files, y)"
    assert data_changes({"digest": "1"}, {"digest": "2"}) == "digest 1 then, 2 now"
    assert data_changes(old, dict(old)) is None

    class Attribute(ToyDataset):
        fingerprint = "abc"

    class Bad(ToyDataset):
        def fingerprint(self):
            return {"when": object()}

    class NotOurs(ToyDataset):
        fingerprint = np.zeros(4)  # an attribute of that name that is no hook: ignored

    assert data_fingerprint(Attribute()) == {"digest": "abc"} and data_fingerprint(NotOurs()) is None
    with pytest.raises(DataError, match=r"fingerprint\(\) gave .*: return a string or a dict of JSON values"):
        data_fingerprint(Bad())


# ---- an ImageFolder through ptrain ----------------------------------------------------------------------------
def picture(seed, h=40, w=48):
    rng = np.random.RandomState(seed)
    return (rng.rand(h, w, 3) * 255).astype("uint8")


def ptrain(*args, cwd):
    return subprocess.run([sys.executable, "-m", "trainer.cli", "run", "resnet", "--data_dir", "data", "--depth", "18",
                           "--image_size", "32", "--resize_size", "36", "--per_device_train_batch_size", "4",
                           "--evaluation_strategy", "no", "--disable_tqdm", "true", "--save_steps", "2", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=600, env=dict(os.environ, PYTHONPATH=REPO))


def test_an_imagefolder_with_one_image_removed_and_another_added_is_refused_naming_both(tmp_path):
    for split in ("train", "val"):
        for k, c in enumerate(("a", "b")):
            os.makedirs(tmp_path / "data" / split / c)
            for i in range(4):
                Image.fromarray(picture(10 * k + i)).save(tmp_path / "data" / split / c / f"{i}.jpg")
    first = ptrain("--output_dir", "run", "--max_steps", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    fp = meta(str(tmp_path / "run" / "checkpoints" / "step-2"))["data_fingerprint"]
    assert sorted(fp["files"]) == [f"{c}/{i}.jpg" for c in "ab" for i in range(4)]
    assert set(fp["class folders"]) == {"a", "b"} and len(fp["digest"]) == 32

    os.remove(tmp_path / "data" / "train" / "a" / "1.jpg")
    Image.fromarray(picture(99)).save(tmp_path / "data" / "train" / "a" / "5.jpg")  # the same count: 8 images
    refused = ptrain("--output_dir", "run", "--max_steps", "4", "--resume_from_checkpoint", "auto", cwd=tmp_path)
    assert refused.returncode == ConfigError.exit_code, refused.stderr[-3000:]
    (line,) = [x for x in refused.stderr.splitlines() if "error" in x.lower()]
    assert "the training data changed since checkpoint" in line and \
        "(files: 1 removed (a/1.jpg), 1 added (a/5.jpg))" in line, line
    assert "--resume_allow_data_change true" in line, line
    assert sorted(n for n in os.listdir(tmp_path / "run" / "checkpoints") if n.startswith("step-")) == ["step-2"]

    anyway = ptrain("--output_dir", "run", "--max_steps", "4", "--resume_from_checkpoint", "auto",
                    "--resume_allow_data_change", "true", cwd=tmp_path)
    assert anyway.returncode == 0, anyway.stderr[-3000:]
    assert "resuming anyway" in anyway.stderr
    assert "a/5.jpg" in meta(str(tmp_path / "run" / "checkpoints" / "step-4"))["data_fingerprint"]["files"]


def test_docstring_examples_of_the_fingerprint_listing_and_rng_modules():
    import doctest

    import models.resnet.folder_listing
    import trainer.checkpoint.fingerprint
    import trainer.data.host_rng

    for module in (trainer.checkpoint.fingerprint, trainer.data.host_rng, models.resnet.folder_listing):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
