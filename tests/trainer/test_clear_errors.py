"""Unclear errors made clear: one line, the right exit code, the file or sample named, nothing left behind."""

import contextlib
import logging
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest
from helpers import REPO, ToyDataset, make_mlp
from patience import patience

from trainer import DataError, Trainer, TrainingArguments, TrainingError
from trainer.checkpoint.lock import JOB_ENV, LOCK_NAME


def ptrain(*argv, env_extra=None, timeout=300):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env_extra or {}))
    for name in (JOB_ENV, "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_JOB_ID"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "trainer.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def one_line(stderr: str) -> bool:
    return stderr.strip().count("\n") == 0 and "Traceback" not in stderr


@contextlib.contextmanager
def mounted(path, *mount_args):
    """``mount ... path`` for the test's duration (root only: skipped with the reason otherwise)."""
    os.makedirs(path, exist_ok=True)
    proc = subprocess.run(["mount", *mount_args, str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount here ({proc.stderr.strip() or proc.returncode}): a full or read-only "
                    "filesystem needs root and a mount namespace")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory):
    """Write until the filesystem holding ``directory`` is full."""
    fd = os.open(os.path.join(directory, "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def fit(out, dataset, **kw):
    args = dict(output_dir=str(out), max_steps=2, per_device_train_batch_size=4, report_to=[],
                save_strategy="no", evaluation_strategy="no", data_seed=0, dataloader_num_workers=0)
    model = kw.pop("model", None) or make_mlp(classes=10)
    args.update(kw)
    return Trainer(model, TrainingArguments(**args), train_dataset=dataset,
                   loss_fn=paddle.nn.CrossEntropyLoss()).fit()


# ---- start-up ---------------------------------------------------------------------------
def test_lock_path_that_is_a_directory(tmp_path):
    (tmp_path / LOCK_NAME).mkdir()
    proc = ptrain("run", "digits", "--output_dir", str(tmp_path), "--max_steps", "2")
    assert proc.returncode == 2 and one_line(proc.stderr), proc.stderr[-2000:]
    assert f"{tmp_path / LOCK_NAME} is a directory, not a lock file" in proc.stderr
    assert sorted(os.listdir(tmp_path)) == [LOCK_NAME] and os.listdir(tmp_path / LOCK_NAME) == []


def test_full_disk_at_start(tmp_path):
    with mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=64k", "tmpfs") as disk:
        fill(disk)
        proc = ptrain("run", "digits", "--output_dir", str(disk / "run"), "--max_steps", "2")
        assert proc.returncode == 2 and one_line(proc.stderr), proc.stderr[-2000:]
        assert f"output_dir {disk / 'run'} is full: writing {disk / 'run' / LOCK_NAME} failed" in proc.stderr
        assert sorted(os.listdir(disk)) == ["filler"]  # no empty lock, no temporary, no directory


# ---- saves --------------------------------------------------------------------------------
def test_full_disk_during_a_save_names_the_file(tmp_path):
    with mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=256k", "tmpfs") as disk:
        big = make_mlp(hidden=4096, classes=10)  # ~0.2 MB of weights, 3x that with AdamW's moments
        with pytest.raises(TrainingError, match=rf"saving checkpoint {disk}/checkpoints/step-2 failed: the disk is "
                                                rf"full writing {disk}/checkpoints/\.tmp-step-2-\d+/\w+\.safetensors"):
            fit(disk, ToyDataset(16), model=big, save_strategy="steps", save_steps=2, save_async=False)
        assert not os.path.exists(disk / LOCK_NAME)


def test_read_only_checkpoint_directory_is_a_save_failure_naming_it(tmp_path):
    """Before: rotation's failure surfaced as exit 4 'callback Checkpoint failed'."""
    common = ["--output_dir", str(tmp_path), "--save_strategy", "steps", "--save_steps", "2", "--evaluation_strategy", "no",
              "--report_to", "jsonl"]
    ckpts = tmp_path / "checkpoints"
    first = ptrain("run", "digits", *common, "--max_steps", "4", "--save_total_limit", "none")  # step-2, step-4
    assert first.returncode == 0, first.stderr[-2000:]
    with mounted(ckpts, "--bind", str(ckpts)):
        proc = subprocess.run(["mount", "-o", "remount,bind,ro", str(ckpts)], capture_output=True, text=True)
        if proc.returncode:
            pytest.skip(f"cannot remount read-only: {proc.stderr.strip()}")
        again = ptrain("run", "digits", *common, "--max_steps", "6", "--resume_from_checkpoint", "auto",
                       "--save_total_limit", "1")
    assert again.returncode == 5, again.stderr[-2000:]
    last = again.stderr.strip().splitlines()[-1]
    assert str(ckpts) in last and "Read-only file system" in last and "callback" not in last, last


def test_leftover_temporaries_are_cleaned(tmp_path):
    fit(tmp_path, ToyDataset(16), save_strategy="steps", save_steps=2)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    root = tmp_path / "checkpoints"
    (root / f".latest.tmp-{dead.pid}").write_text("step-2\n")
    (root / ".deleting-step-1").mkdir()
    (root / ".deleting-step-1" / "model.safetensors").write_bytes(b"x")
    fit(tmp_path, ToyDataset(16), save_strategy="no", max_steps=3, resume_from_checkpoint="auto")
    assert sorted(n for n in os.listdir(root) if n.startswith(".")) == []


# ---- data, without workers ---------------------------------------------------------------------
class Samples(paddle.io.Dataset):
    def __init__(self, n=16, label_at=None, label=0, wide_at=None, claims=None):
        self.n, self.label_at, self.label, self.wide_at, self.claims = n, label_at, label, wide_at, claims

    def __len__(self):
        return self.claims or self.n

    def __getitem__(self, i):
        if i >= self.n:
            raise IndexError(f"index {i} is out of bounds")
        x = np.full(9 if i == self.wide_at else 8, 0.1, "float32")
        return x, np.int64(self.label if i == self.label_at else i % 10)


@pytest.mark.parametrize("label", [12, -3])
def test_label_out_of_range_names_the_sample(tmp_path, label):
    with pytest.raises(DataError, match=rf"label {label} of sample 5 \(field labels\) is outside the model's 10 "
                                        r"classes \[0, 9\]"):
        fit(tmp_path, Samples(label_at=5, label=label), per_device_train_batch_size=16, max_steps=1)


class FloatLabels(paddle.io.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return {"x": np.full(8, 0.1 * i, "float32"), "labels": np.float32(i % 2)}


class LossInside(paddle.nn.Layer):
    """A model that computes its classification loss itself (as paddlenlp's heads do)."""

    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(8, 2)

    def forward(self, x, labels=None):
        logits = self.fc(x)
        return (paddle.nn.functional.cross_entropy(logits, labels), logits) if labels is not None else logits


def test_float_labels_for_a_classification_loss_name_the_dtype_and_the_fix(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to=[], save_strategy="no",
                             evaluation_strategy="no")
    with pytest.raises(DataError, match=r"^labels are float32 but CrossEntropyLoss takes class indices of dtype int64: "
                                        r"give int64 labels .*soft_label=True"):
        Trainer(make_mlp(), args, train_dataset=Samples(), loss_fn=paddle.nn.CrossEntropyLoss(),
                collate_fn=lambda b: (paddle.to_tensor(np.stack([x for x, _ in b])),
                                      paddle.to_tensor(np.array([y for _, y in b], "float32")))).fit()
    with pytest.raises(DataError, match=r"^backward failed: CrossEntropyWithSoftmaxGradCPUKernel has no float32 "
                                        r"version; the labels are float32: a classification loss needs int64") as err:
        Trainer(LossInside(), args, train_dataset=FloatLabels()).fit()
    assert "\n" not in str(err.value)


def test_mismatched_shapes_name_the_sample_and_field(tmp_path):
    with pytest.raises(DataError, match=r"cannot be collated .*field 0 of sample 3 has shape \[9\], of sample \d+ \[8\]"):
        fit(tmp_path, Samples(wide_at=3), per_device_train_batch_size=16, max_steps=1)


def test_a_len_that_lies_names_the_sample(tmp_path):
    with pytest.raises(DataError, match=r"sample 1[6-9] cannot be read .*__len__ says 20"):
        fit(tmp_path, Samples(claims=20), per_device_train_batch_size=20, max_steps=1)


def test_data_errors_exit_3_in_one_line_from_ptrain(tmp_path):
    script = tmp_path / "bad_labels.py"
    script.write_text(
        "import sys\nsys.path[:0] = [%r, %r, %r]\n" % (REPO, os.path.join(REPO, "tests"), os.path.dirname(__file__))
        + "from test_clear_errors import Samples, fit\nfrom trainer.errors import TrainerError\n"
        + "try:\n    fit(%r, Samples(label_at=2, label=12), per_device_train_batch_size=16, max_steps=1)\n" % str(tmp_path / "o")
        + "except TrainerError as exc:\n    print(f'ptrain: error: {exc}', file=sys.stderr); sys.exit(exc.exit_code)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=patience(300))
    assert proc.returncode == 3 and "label 12 of sample 2" in proc.stderr, proc.stderr[-2000:]


# ---- verify-resume, world-size change ------------------------------------------------------------
def test_verify_resume_with_a_bad_flag_leaves_nothing(tmp_path):
    proc = ptrain("verify-resume", "digits", "--steps", "2", "--no_such_field", "1", env_extra={"TMPDIR": str(tmp_path)})
    assert proc.returncode == 2 and one_line(proc.stderr), proc.stderr[-2000:]
    assert "no_such_field" in proc.stderr and "kept" not in proc.stderr
    assert os.listdir(tmp_path) == []


def test_resume_without_a_callback_whose_state_was_empty_does_not_warn(tmp_path, caplog):
    """A run on more processes had a StallWatchdog (no state); resumed on one process, nothing is lost."""
    from callbacks.watchdog import StallWatchdog

    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, save_steps=2, report_to=[],
                             evaluation_strategy="no", save_async=False)
    Trainer(make_mlp(), args, train_dataset=ToyDataset(16), loss_fn=paddle.nn.CrossEntropyLoss(),
            callbacks=[StallWatchdog(timeout=600)]).fit()
    caplog.set_level(logging.WARNING)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, save_strategy="no", report_to=[],
                             evaluation_strategy="no", resume_from_checkpoint="auto")
    state = Trainer(make_mlp(), args, train_dataset=ToyDataset(16), loss_fn=paddle.nn.CrossEntropyLoss()).fit()
    assert state.global_step == 3
    assert "not registered" not in caplog.text
