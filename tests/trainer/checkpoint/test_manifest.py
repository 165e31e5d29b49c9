"""Checkpoints whose manifest cannot lie (issue 40, items 1-3), on real saves and real resumes.

A manifest whose format version this code does not read is refused (by resume and by inspect) before anything
else in it is read.

1. The manifest is covered by its own digest (``manifest.sha256``, written after it): an edited manifest (the step
   changed; in a sharded checkpoint, two same-shaped tensors swapped in the index while every shard still matches
   its sha256) is a damaged checkpoint: ``auto`` sets it aside and resumes the older one, ``ptrain inspect`` calls it
   INVALID. A checkpoint of the previous release (no digest) still resumes, and inspect says how it was verified.
2. A checkpoint whose files (a sharded one: whose index) lack a tensor it recorded, or that its other parameters'
   accumulators imply, is refused before anything trains: one DataError (exit 3) naming what is missing, not
   paddle's ``AssertionError`` at the first optimizer step.
3. An unknown ``format_version`` is checked first, for every format: skipped and left as it is, never set aside.

``ptrain inspect`` and resume give one verdict (``trainer.checkpoint.manifest.verdict``). The sharded cases share one
2-process sharding-stage-1 run (saves at steps 4 and 8) and resume on one process.
"""

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys

import numpy as np
import paddle
import pytest
from helpers import REPO, ToyDataset, make_mlp
from patience import patience
from safetensors.numpy import load_file, save_file

from trainer import DataError, Trainer, TrainingArguments
from trainer.checkpoint.manifest import read_verified, verdict, verify
from trainer.checkpoint.store import resolve
from trainer.cli.describe import describe_checkpoint, describe_run

pytestmark = pytest.mark.timeout(900)


def _train(out, max_steps=4, resume=None):
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=8, max_steps=max_steps, learning_rate=0.01,
                             save_steps=2, report_to=[], evaluation_strategy="no", save_async=False)
    trainer = Trainer(make_mlp(), args, train_dataset=ToyDataset(40), loss_fn=paddle.nn.CrossEntropyLoss())
    trainer.fit(resume_from_checkpoint=resume)
    return trainer


def _sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _edit_json(path, change):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    change(doc)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)


def _resign(ckpt, name):
    """Record ``name``'s new size and sha256 in the manifest (whose digest is then stale: :func:`_reseal`)."""
    _edit_json(ckpt / "manifest.json", lambda m: m["files"][name].update(bytes=os.path.getsize(ckpt / name),
                                                                        sha256=_sha(ckpt / name)))


def _reseal(ckpt):
    """The manifest's digest, written anew for the manifest as it is now (a buggy writer, or a careful forger)."""
    (ckpt / "manifest.sha256").write_text(f"{_sha(ckpt / 'manifest.json')}  manifest.json\n")


def _as_previous_release(ckpt):
    """What the previous release wrote: no manifest digest, no record of the tensors in trainer.json."""
    if (ckpt / "manifest.sha256").exists():  # (tolerant, so the test also runs on the previous release's code)
        os.remove(ckpt / "manifest.sha256")
    _edit_json(ckpt / "trainer.json", lambda meta: meta.pop("tensor_names", None))
    _resign(ckpt, "trainer.json")
    _edit_json(ckpt / "manifest.json", lambda m: m.pop("manifest_digest", None))


def _steps(out):
    return sorted(n for n in os.listdir(out / "checkpoints") if n.startswith("step-"))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    _train(out)  # step-2, step-4
    return out


@pytest.fixture
def copy(run_dir, tmp_path):
    return shutil.copytree(run_dir, tmp_path / "copy")


# ---- item 1: the manifest is verified as the files are -------------------------------------------------
def test_an_edited_manifest_is_set_aside_and_the_older_checkpoint_resumed(copy, caplog):
    ckpt = copy / "checkpoints" / "step-4"
    _edit_json(ckpt / "manifest.json", lambda m: m.update(step=3))  # every file still matches its sha256
    found = verdict(str(ckpt))
    assert found.status == "damaged" and "does not match its digest in manifest.sha256" in found.text
    assert "INVALID: manifest.json changed after it was written" in describe_run(str(copy))
    assert "manifest.sha256" in describe_checkpoint(str(ckpt)) and "DOES NOT MATCH" in describe_checkpoint(str(ckpt))
    with caplog.at_level(logging.INFO, logger="trainer.checkpoint"):
        _train(copy, max_steps=6, resume="auto")
    assert f"resuming from {copy / 'checkpoints' / 'step-2'}" in caplog.text
    assert "set aside damaged checkpoint step-4 as step-4.damaged" in caplog.text
    assert (copy / "checkpoints" / "step-4.damaged").is_dir()


def test_an_explicit_path_to_an_edited_manifest_is_refused_in_one_line(copy):
    ckpt = copy / "checkpoints" / "step-4"
    _edit_json(ckpt / "manifest.json", lambda m: m.update(step=3))
    with pytest.raises(DataError, match="manifest.json does not match its digest in manifest.sha256") as err:
        _train(copy, max_steps=6, resume=str(ckpt))
    assert "\n" not in str(err.value)


def test_a_missing_digest_of_a_manifest_that_names_one_is_damage(copy):
    ckpt = copy / "checkpoints" / "step-4"
    os.remove(ckpt / "manifest.sha256")
    found = verdict(str(ckpt))
    assert found.status == "damaged" and "names its digest file manifest.sha256, which is missing" in found.text


def test_latest_moves_only_to_a_manifest_that_matches_its_digest(copy):
    from trainer.checkpoint.writer import _publish_latest

    root = copy / "checkpoints"
    _edit_json(root / "step-2" / "manifest.json", lambda m: m.update(step=1))
    with pytest.raises(DataError, match="does not match its digest"):
        _publish_latest(str(root), "step-2")
    assert (root / "latest").read_text().strip() == "step-4"


def test_a_checkpoint_of_the_previous_release_resumes_and_inspect_says_how_it_was_verified(copy):
    ckpt = copy / "checkpoints" / "step-4"
    _as_previous_release(ckpt)
    found = verdict(str(ckpt))
    assert found.status == "valid" and "written before manifests carried a digest" in found.text, found.text
    assert "covered by no checksum" in describe_checkpoint(str(ckpt))
    # ... and a stray or stale digest beside it is still checked: a manifest edited back to "previous release"
    _reseal(ckpt)
    _edit_json(ckpt / "manifest.json", lambda m: m.update(step=3))
    assert verdict(str(ckpt)).status == "damaged"
    os.remove(ckpt / "manifest.sha256")
    assert _train(copy, max_steps=6, resume=str(ckpt)).state.global_step == 6


# ---- item 2: every tensor the checkpoint needs is there, checked before anything trains -----------------
def _drop_optimizer_tensor(ckpt):
    """Rewrite optimizer.safetensors without one moment, re-signed and resealed: only the content check can tell."""
    tensors = load_file(str(ckpt / "optimizer.safetensors"))
    dropped = sorted(k for k in tensors if k.endswith("_moment2_0"))[0]
    del tensors[dropped]
    save_file(tensors, str(ckpt / "optimizer.safetensors"))
    _resign(ckpt, "optimizer.safetensors")
    _reseal(ckpt)
    return dropped


@pytest.mark.parametrize("release", ["this", "previous"])
def test_a_checkpoint_that_lacks_an_optimizer_tensor_is_refused_before_training(copy, release):
    ckpt = copy / "checkpoints" / "step-4"
    if release == "previous":
        _as_previous_release(ckpt)
    dropped = _drop_optimizer_tensor(ckpt)
    found = verdict(str(ckpt))
    assert found.status == "damaged" and f"lacks 1 tensor(s): optimizer/{dropped}" in found.text, found.text
    args = TrainingArguments(output_dir=str(copy), per_device_train_batch_size=8, max_steps=6, learning_rate=0.01,
                             save_steps=2, report_to=[], evaluation_strategy="no", save_async=False)
    trainer = Trainer(make_mlp(), args, train_dataset=ToyDataset(40), loss_fn=paddle.nn.CrossEntropyLoss())
    with pytest.raises(DataError) as err:
        trainer.fit(resume_from_checkpoint=str(ckpt))
    assert str(err.value) == found.text  # resume's verdict is inspect's
    assert trainer.state.global_step == 0 and _steps(copy) == ["step-2", "step-4"]  # nothing trained or saved
    # auto: set aside like any damaged checkpoint, the older one resumed
    assert resolve("auto", str(copy)) == str(copy / "checkpoints" / "step-2")
    assert _steps(copy) == ["step-2", "step-4.damaged"]


def test_ptrain_exits_3_before_training_on_a_checkpoint_that_lacks_an_optimizer_tensor(tmp_path):
    def ptrain(*args, cwd):
        return subprocess.run([sys.executable, "-m", "trainer.cli", *args], capture_output=True, text=True, cwd=cwd,
                              timeout=patience(300), env=dict(os.environ, PYTHONPATH=REPO))

    done = ptrain("run", "digits", "--output_dir", "src", "--max_steps", "4", "--save_steps", "4",
                  "--evaluation_strategy", "no", "--disable_tqdm", "true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ckpt = tmp_path / "src" / "checkpoints" / "step-4"
    dropped = _drop_optimizer_tensor(ckpt)
    inspected = ptrain("inspect", str(ckpt), cwd=tmp_path)
    assert inspected.returncode == DataError.exit_code and f"optimizer/{dropped}" in inspected.stdout
    done = ptrain("run", "digits", "--output_dir", "new", "--max_steps", "8", "--evaluation_strategy", "no",
                  "--disable_tqdm", "true", "--resume_from_checkpoint", str(ckpt), cwd=tmp_path)
    assert done.returncode == DataError.exit_code, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and f"lacks 1 tensor(s): optimizer/{dropped}" in errors[0], done.stderr
    assert "AssertionError" not in done.stderr and not os.path.isdir(tmp_path / "new" / "checkpoints" / "step-8")


# ---- item 3: an unknown format version is skipped and left as it is ----------------------------------
@pytest.mark.parametrize("version", [0, 3, 999, "1", None])
def test_an_unknown_format_version_is_refused_in_one_line(copy, version):
    ckpt = copy / "checkpoints" / "step-4"
    _edit_json(ckpt / "manifest.json", lambda m: m.update(format_version=version))
    with pytest.raises(DataError, match=rf"has format_version {version!r}, which this paddle-trainer does not read") as err:
        verify(str(ckpt))
    assert "\n" not in str(err.value)
    with pytest.raises(DataError, match="format_version"):
        _train(copy, max_steps=6, resume=str(ckpt))
    # auto skips it and takes the older checkpoint that verifies
    assert resolve("auto", str(copy)) == str(copy / "checkpoints" / "step-2")
    assert f"manifest: INVALID: {ckpt}/manifest.json has format_version {version!r}" in describe_checkpoint(str(ckpt))


def test_ptrain_inspect_calls_version_999_invalid(copy):
    _edit_json(copy / "checkpoints" / "step-4" / "manifest.json", lambda m: m.update(format_version=999))
    proc = subprocess.run([sys.executable, "-m", "trainer.cli", "inspect", str(copy)], capture_output=True, text=True,
                          cwd=REPO, timeout=patience(120))
    line = next(line for line in proc.stdout.splitlines() if line.strip().startswith("step-4"))
    assert "INVALID" in line and "format_version 999" in line, proc.stdout
    assert "resume 'auto' would take: step-2" in proc.stdout


def test_an_unknown_format_version_is_left_as_it_is(copy):
    ckpt = copy / "checkpoints" / "step-4"
    _edit_json(ckpt / "manifest.json", lambda m: m.update(format_version=99))
    found = verdict(str(ckpt))
    assert found.status == "unsupported" and "format_version 99" in found.text and "left as it is" in found.text
    assert "format_version 99 unknown (resume skips it and leaves it as it is)" in describe_run(str(copy))
    assert _train(copy, max_steps=6, resume="auto").state.global_step == 6
    assert (copy / "checkpoints" / "step-4" / "manifest.json").is_file()  # not renamed, not deleted
    assert not any(".damaged" in n for n in os.listdir(copy / "checkpoints"))


# ---- sharded checkpoints: one manifest over the shards of 2 ranks ---------------------------------------
@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    from sharded_trials import STOP, launch_fresh

    out = str(tmp_path_factory.mktemp("sharded") / "part")
    launch_fresh([out, "part", "stage1", STOP], 2, out + "-log")  # saves step-4 and step-8, one shard per rank
    return out


@pytest.fixture
def sharded_copy(sharded_run, tmp_path):
    return shutil.copytree(sharded_run, tmp_path / "sharded")


def _shard_toy():
    spec = importlib.util.spec_from_file_location("shard_toy", os.path.join(REPO, "tests", "distributed", "workers",
                                                                            "shard_toy.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_same_shaped_tensors_swapped_in_the_index_are_refused(sharded_copy):
    from sharded_trials import run_one

    ckpt = sharded_copy / "checkpoints" / "step-8"

    def swap(manifest):
        index = manifest["tensors"]
        assert index["model/0.bias"]["shape"] == index["model/2.bias"]["shape"]
        index["model/0.bias"]["parts"], index["model/2.bias"]["parts"] = (index["model/2.bias"]["parts"],
                                                                          index["model/0.bias"]["parts"])

    _edit_json(ckpt / "manifest.json", swap)  # every shard still matches its sha256
    found = verdict(str(ckpt))
    assert found.status == "damaged" and "does not match its digest" in found.text
    assert "INVALID: manifest.json changed after it was written" in describe_run(str(sharded_copy))
    # resumed on one process: the step-8 checkpoint is set aside, step-4's weights are what the run starts from
    log = run_one([str(sharded_copy), "res", "plain", 0, "auto"])
    assert "set aside damaged checkpoint step-8 as step-8.damaged" in log
    loaded = np.load(sharded_copy / "loaded-res-rank0.npz")
    expected = read_verified(str(sharded_copy / "checkpoints" / "step-4")).model_state
    for name, value in expected.items():
        assert np.array_equal(loaded[name], value), name


@pytest.mark.parametrize("release", ["this", "previous"])
def test_an_index_that_lacks_an_optimizer_tensor_is_refused_before_training(sharded_copy, release):
    ckpt = sharded_copy / "checkpoints" / "step-8"
    if release == "previous":
        _as_previous_release(ckpt)
    _edit_json(ckpt / "manifest.json", lambda m: m["tensors"].pop("optimizer/param:2.weight_moment2_0"))
    _reseal(ckpt)  # a manifest written that way: only the check of what it lists can tell
    found = verdict(str(ckpt))
    assert found.status == "damaged" and "lacks 1 tensor(s): optimizer/param:2.weight_moment2_0" in found.text
    with pytest.raises(DataError) as err:  # resumed on 1 process (the 2-rank stage-1 checkpoint resharded onto it)
        _shard_toy().main(str(sharded_copy), "res", "plain", 0, str(ckpt))
    assert str(err.value) == found.text and "\n" not in found.text
    assert not os.path.exists(sharded_copy / "loaded-res-rank0.npz")  # refused before the load, nothing trained


def test_a_sharded_checkpoint_of_an_unknown_format_version_is_left_as_it_is(sharded_copy):
    ckpt = sharded_copy / "checkpoints" / "step-8"
    _edit_json(ckpt / "manifest.json", lambda m: m.update(format_version=99))
    found = verdict(str(ckpt))
    assert found.status == "unsupported" and "format_version 99" in found.text
    assert "format_version 99 unknown (resume skips it and leaves it as it is)" in describe_run(str(sharded_copy))
    assert resolve("auto", str(sharded_copy)) == str(sharded_copy / "checkpoints" / "step-4")
    assert ckpt.is_dir() and not any(".damaged" in n for n in os.listdir(sharded_copy / "checkpoints"))
