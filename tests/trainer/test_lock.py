"""One live run per output_dir; an unwritable output_dir fails before any work."""

import json
import socket
import subprocess
import sys

import paddle
import pytest
from helpers import ToyDataset, make_mlp

from trainer import ConfigError, Trainer, TrainingArguments
from trainer.lock import LOCK_NAME, RunLock


def make(out):
    args = TrainingArguments(output_dir=str(out), max_steps=2, report_to=[], save_strategy="no")
    return Trainer(make_mlp(), args, train_dataset=ToyDataset(16), loss_fn=paddle.nn.CrossEntropyLoss())


def test_second_run_while_the_first_lives_fails_naming_it(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname(), "started": 0}))
        with pytest.raises(ConfigError, match=rf"output_dir {tmp_path} is in use by live process {sleeper.pid} on "):
            make(tmp_path).fit()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": 0}))
    state = make(tmp_path).fit()
    assert state.status == "completed" and not (tmp_path / LOCK_NAME).exists()
    assert "taking over the lock" in caplog.text


def test_lock_from_another_host_is_not_guessed_away(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "some-other-node", "started": 0}))
    with pytest.raises(ConfigError, match="in use by process 1 on host some-other-node"):
        RunLock(str(tmp_path)).acquire()


def test_lock_is_released_after_a_failed_run(tmp_path):
    class Bad(Trainer):
        def compute_loss(self, model, batch):
            raise ValueError("boom")

    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, report_to=[], save_strategy="no")
    with pytest.raises(ValueError):
        Bad(make_mlp(), args, train_dataset=ToyDataset(16)).fit()
    assert not (tmp_path / LOCK_NAME).exists()


def test_output_dir_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match=rf"output_dir {blocker}/run cannot be created \(Not a directory\): choose a writable --output_dir"):
        make(blocker / "run").fit()
