"""``ptrain inspect``: describe_run and describe_checkpoint on a real run, intact and damaged."""

import os
import pickle
import shutil

import paddle
import pytest
from helpers import ToyDataset, make_mlp

from trainer import Trainer, TrainingArguments
from trainer.errors import ConfigError
from trainer.cli.describe import describe, describe_checkpoint, describe_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=8, max_steps=6, learning_rate=0.01,
                             save_strategy="steps", save_steps=2, evaluation_strategy="steps", eval_steps=2,
                             metric_for_best_model="eval_loss", report_to=[], save_async=False)
    Trainer(make_mlp(), args, train_dataset=ToyDataset(40), eval_dataset=ToyDataset(16, seed=1),
            loss_fn=paddle.nn.CrossEntropyLoss()).fit()
    return out


@pytest.fixture
def copy(run_dir, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(run_dir, target)
    return target


def test_describe_run_lists_checkpoints_newest_first(run_dir):
    text = describe_run(str(run_dir))
    names = [line.split()[0] for line in text.splitlines() if line.strip().startswith("step-")]
    assert names == ["step-6", "step-4", "step-2"]
    assert "step-6" in next(line for line in text.splitlines() if "<- latest" in line)
    assert "resume 'auto' would take: step-6" in text
    assert "best: eval_loss=" in text
    assert text.count(" valid") == 3
    assert describe(str(run_dir)) == text


def test_describe_checkpoint_says_what_it_holds(run_dir):
    text = describe_checkpoint(str(run_dir / "checkpoints" / "step-4"))
    assert ("manifest: valid (complete: the manifest matches its digest in manifest.sha256; 3 files match their sizes "
            "and sha256)") in text
    assert "progress: step 4 of 6; epoch 0, step 4 of 5 in the epoch; 32 samples seen" in text
    assert "processes: 1; global batch 8 (8 per device x 1 accumulation x 1)" in text
    assert "metrics (last evaluation): eval_loss=" in text
    assert "model: 4 tensors, 178 values (F32)" in text
    for name in ("model.safetensors", "optimizer.safetensors", "trainer.json"):
        assert any(line.split()[0] == name and line.endswith(" ok") for line in text.splitlines()), name
    # through the latest pointer, and through describe()
    latest = describe_checkpoint(str(run_dir / "checkpoints" / "latest"))
    assert latest.startswith(f"checkpoint {run_dir / 'checkpoints' / 'step-6'}")
    assert describe(str(run_dir / "checkpoints" / "step-4")) == text


def test_damage_is_described_not_raised(copy):
    root = copy / "checkpoints"
    with open(root / "step-6" / "model.safetensors", "r+b") as f:
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0x10]))
    with open(root / "step-4" / "trainer.json", "r+b") as f:
        f.truncate(100)
    os.remove(root / "step-2" / "manifest.json")

    text = describe_checkpoint(str(root / "step-6"))
    assert "manifest: INVALID: checkpoint file" in text and "model.safetensors" in text.splitlines()[1]
    assert any("model.safetensors" in line and "WRONG CONTENT" in line for line in text.splitlines())
    text = describe_checkpoint(str(root / "step-4"))
    assert "trainer.json: unreadable (JSONDecodeError" in text
    assert any("trainer.json" in line and "WRONG SIZE" in line for line in text.splitlines())
    text = describe_run(str(copy))
    assert "step-6" in text and "INVALID: model.safetensors wrong content" in text
    assert "INVALID: trainer.json wrong size" in text
    assert "INVALID: no manifest.json (incomplete)" in text
    assert "resume 'auto' would take: none (a fresh start)" in text


def test_dangling_latest_and_leftovers(copy):
    root = copy / "checkpoints"
    (root / "latest").write_text("step-99\n")
    (root / ".tmp-step-8-12345").mkdir()
    text = describe_run(str(copy))
    assert "latest -> 'step-99', which does not exist" in text
    assert "resume 'auto' would take: step-6" in text
    assert "leftovers of interrupted saves or deletions (removed at the next save): .tmp-step-8-12345" in text


class _Payload:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_inspecting_never_unpickles(copy, tmp_path):
    marker = tmp_path / "PWNED"
    ckpt = copy / "checkpoints" / "step-6"
    for name in ("model.pdparams", "optimizer.pdopt"):
        (ckpt / name).write_bytes(pickle.dumps(_Payload(str(marker))))
    (ckpt / "optimizer.safetensors").write_bytes(pickle.dumps(_Payload(str(marker))))
    text = describe_checkpoint(str(ckpt)) + describe_run(str(copy))
    assert not marker.exists()
    assert any("model.pdparams" in line and "not in the manifest (unverified)" in line for line in text.splitlines())
    assert "optimizer: header length beyond the end of the file" in text or "optimizer: unreadable" in text


def test_bad_paths(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        describe_checkpoint(str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="has no checkpoints/ folder"):
        describe_run(str(tmp_path))


@pytest.mark.parametrize("target", ["run", "checkpoint"])
def test_ptrain_inspect_reads_files_without_importing_paddle(run_dir, target):
    """``ptrain inspect`` after a failure answers at once: it reads manifests and headers, never paddle."""
    import subprocess
    import sys

    from helpers import REPO

    path = str(run_dir if target == "run" else run_dir / "checkpoints" / "step-4")
    code = ("import sys; from trainer.cli import main; code = main(['inspect', sys.argv[1]]); "
            "print('paddle imported:', 'paddle' in sys.modules); sys.exit(code)")
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 0, out.stderr
    assert "manifest" in out.stdout and out.stdout.strip().splitlines()[-1] == "paddle imported: False"
