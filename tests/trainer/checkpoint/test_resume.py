"""A run saved and resumed mid-epoch ends with the parameters of an uninterrupted run."""

import numpy as np
import paddle
import pytest
from helpers import ToyDataset, make_mlp, params_of

from trainer import ConfigError, DataError, Trainer, TrainingArguments


def run(out, max_steps, resume=None, dropout=True):
    paddle.seed(0)
    layers = [paddle.nn.Linear(8, 16), paddle.nn.ReLU()] + ([paddle.nn.Dropout(0.3)] if dropout else []) + [paddle.nn.Linear(16, 2)]
    model = paddle.nn.Sequential(*layers)
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=8, max_steps=max_steps,
                             learning_rate=0.01, warmup_steps=3, lr_scheduler_type="cosine", save_steps=5,
                             report_to=[], evaluation_strategy="no")
    trainer = Trainer(model, args, train_dataset=ToyDataset(60), loss_fn=paddle.nn.CrossEntropyLoss())
    trainer.fit(resume_from_checkpoint=resume)
    return trainer


def test_resume_mid_epoch_is_exact(tmp_path):
    full = run(tmp_path / "full", 17)
    part = run(tmp_path / "part", 17)
    # throw away the end: resume from step 10 (mid-epoch 2 of 8 batches/epoch) in a fresh trainer
    resumed = run(tmp_path / "part", 17, resume=str(tmp_path / "part" / "checkpoints" / "step-10"))
    assert resumed.state.global_step == 17
    for k, v in params_of(full.model).items():
        np.testing.assert_array_equal(params_of(resumed.model)[k], v, err_msg=k)
    assert resumed.optimizer.get_lr() == full.optimizer.get_lr()
    del part


def test_resume_auto_without_checkpoint_starts_fresh(tmp_path):
    t = run(tmp_path, 2, resume="auto")
    assert t.state.global_step == 2


def test_resume_path_that_does_not_exist(tmp_path):
    with pytest.raises(ConfigError, match="resume_from_checkpoint='/nope' does not exist"):
        run(tmp_path, 2, resume="/nope")


def test_checkpoint_from_another_model_names_parameters(tmp_path):
    run(tmp_path / "a", 5)
    model = make_mlp(hidden=4)
    # the same settings as the run that wrote it (a changed setting is refused first: test_resume_settings.py)
    args = TrainingArguments(output_dir=str(tmp_path / "b"), per_device_train_batch_size=8, max_steps=8,
                             learning_rate=0.01, warmup_steps=3, lr_scheduler_type="cosine", report_to=[],
                             save_strategy="no", evaluation_strategy="no")
    t = Trainer(model, args, train_dataset=ToyDataset(60), loss_fn=paddle.nn.CrossEntropyLoss())
    with pytest.raises(DataError, match=r"is for another model \(.*shape differs for \['0.bias'"):
        t.fit(resume_from_checkpoint=str(tmp_path / "a" / "checkpoints" / "step-5"))


def test_damaged_checkpoint_is_refused(tmp_path):
    run(tmp_path, 5)
    ckpt = tmp_path / "checkpoints" / "step-5"
    with open(ckpt / "model.safetensors", "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x00\x01\x02\x03")
    with pytest.raises(DataError, match="does not match its manifest"):
        run(tmp_path, 7, resume=str(ckpt))


@pytest.mark.parametrize("how", ["path", "auto"])
def test_resume_reads_and_hashes_each_file_of_the_checkpoint_once(tmp_path, monkeypatch, how):
    import os

    from trainer.checkpoint import manifest

    import shutil

    full = run(tmp_path / "full", 12)
    run(tmp_path / "part", 12)
    shutil.rmtree(tmp_path / "part" / "checkpoints" / "step-12")  # auto: step-10 is now the newest
    reads = []
    real = manifest.read_hashed

    def counted(path, keep=True):
        reads.append((os.path.basename(os.path.dirname(path)), os.path.basename(path), keep))
        return real(path, keep)

    monkeypatch.setattr(manifest, "read_hashed", counted)
    resume = str(tmp_path / "part" / "checkpoints" / "step-10") if how == "path" else "auto"
    resumed = run(tmp_path / "part", 12, resume=resume)
    chosen = [r for r in reads if r[0] == "step-10"]
    assert sorted(chosen) == sorted(("step-10", name, True) for name in
                                    ("model.safetensors", "optimizer.safetensors", "trainer.json")), reads
    for k, v in params_of(full.model).items():  # what was read once is what was applied
        np.testing.assert_array_equal(params_of(resumed.model)[k], v, err_msg=k)


def test_a_file_read_while_hashed_equals_the_file(tmp_path):
    import hashlib

    from trainer.checkpoint import manifest

    data = np.random.RandomState(0).bytes(3 * manifest.CHUNK + 12345)
    path = tmp_path / "blob"
    path.write_bytes(data)
    for size in (0, 1, manifest.CHUNK, manifest.CHUNK + 1, len(data)):
        path.write_bytes(data[:size])
        buf, digest = manifest.read_hashed(str(path))
        assert bytes(buf) == data[:size] and digest == hashlib.sha256(data[:size]).hexdigest()
        assert manifest.sha256_file(str(path)) == digest
