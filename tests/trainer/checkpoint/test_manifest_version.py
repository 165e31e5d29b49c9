"""A checkpoint manifest with a format version this code does not read is refused, by resume and by inspect."""

import json
import os
import subprocess
import sys

import paddle
import pytest
from helpers import REPO, ToyDataset, make_mlp
from patience import patience

from trainer import DataError, Trainer, TrainingArguments
from trainer.checkpoint.manifest import verify
from trainer.checkpoint.store import resolve
from trainer.cli.describe import describe_checkpoint


def _train(out, max_steps=4, resume=None):
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=8, max_steps=max_steps, learning_rate=0.01,
                             save_steps=2, report_to=[], evaluation_strategy="no", save_async=False)
    t = Trainer(make_mlp(), args, train_dataset=ToyDataset(40), loss_fn=paddle.nn.CrossEntropyLoss())
    t.fit(resume_from_checkpoint=resume)
    return t


def _set_version(ckpt, version):
    path = os.path.join(ckpt, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    manifest["format_version"] = version
    with open(path, "w") as f:
        json.dump(manifest, f)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    _train(out)
    return out


@pytest.mark.parametrize("version", [0, 3, 999, "1", None])
def test_unknown_format_version_is_refused_in_one_line(run_dir, tmp_path, version):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(run_dir, out)
    ckpt = str(out / "checkpoints" / "step-4")
    _set_version(ckpt, version)
    with pytest.raises(DataError, match=rf"has format_version {version!r}, which this paddle-trainer does not read") as err:
        verify(ckpt)
    assert "\n" not in str(err.value)
    with pytest.raises(DataError, match="format_version"):
        _train(out, max_steps=6, resume=ckpt)
    # auto skips it and takes the older checkpoint that verifies
    assert resolve("auto", str(out)) == str(out / "checkpoints" / "step-2")
    text = describe_checkpoint(ckpt)
    assert f"manifest: INVALID: {ckpt}/manifest.json has format_version {version!r}" in text


def test_ptrain_inspect_calls_version_999_invalid(run_dir, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(run_dir, out)
    _set_version(str(out / "checkpoints" / "step-4"), 999)
    proc = subprocess.run([sys.executable, "-m", "trainer.cli", "inspect", str(out)], capture_output=True, text=True,
                          cwd=REPO, timeout=patience(120))
    line = next(line for line in proc.stdout.splitlines() if line.strip().startswith("step-4"))
    assert "INVALID" in line and "format_version 999" in line, proc.stdout
    assert "resume 'auto' would take: step-2" in proc.stdout
