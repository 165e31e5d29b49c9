"""What the trackers share: report_to all takes the installed ones, a requested tracker that is not installed
stops the run at the start with one line naming the extra, and a tracker that fails mid-run warns once while
training goes on."""

import json
import logging
import os
import sys

import paddle
import pytest
from helpers import ToyDataset, make_mlp

from callbacks.tracking import Tracker, curve_items, hyperparameters
from trainer import Trainer, TrainingArguments
from trainer.errors import ConfigError


@pytest.mark.parametrize("name, module", [("wandb", "wandb"), ("mlflow", "mlflow"), ("tensorboard", "tensorboard")])
def test_a_requested_tracker_that_is_not_installed_names_its_extra(tmp_path, monkeypatch, name, module):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: find_spec gives None, import fails
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=["jsonl", name])
    with pytest.raises(ConfigError) as err:
        Trainer(make_mlp(), args, train_dataset=ToyDataset(16), loss_fn=paddle.nn.CrossEntropyLoss())
    assert err.value.exit_code == 2
    assert str(err.value) == (f"report_to {name}: {'tensorboardX' if name == 'tensorboard' else module} is not installed: "
                              f'pip install -e ".[{name}]" in the paddle-trainer checkout (or leave {name} out of report_to)')
    # all = the default loggers and the trackers that are installed: this one is left out
    assert name not in TrainingArguments(report_to=["all"]).report_to


def test_all_is_the_default_loggers_and_every_installed_tracker(monkeypatch):
    for module in ("tensorboardX", "tensorboard", "wandb"):
        monkeypatch.setitem(sys.modules, module, None)
    report_to = TrainingArguments(report_to=["all"]).report_to
    assert report_to[:3] == ["tqdm", "jsonl", "visualdl"] and "wandb" not in report_to and "tensorboard" not in report_to
    assert ("mlflow" in report_to) == (__import__("importlib").util.find_spec("mlflow") is not None)


class Breaks(Tracker):
    """A tracker whose backend goes away at its second write (as a server that died or a full disk)."""

    name = "broken"

    def __init__(self):
        super().__init__()
        self.writes = 0

    def start(self, trainer, resumed):
        self.run_id = "r1"

    def scalars(self, items, step):
        self.writes += 1
        if self.writes >= 2:
            raise OSError(28, "No space left on device")

    def finish(self, trainer, status):
        raise AssertionError("never called after a failure")


def test_a_tracker_that_fails_mid_run_warns_once_and_training_completes(tmp_path, caplog):
    tracker = Breaks()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=12, logging_steps=2, report_to=[], save_strategy="no",
                             evaluation_strategy="no")
    trainer = Trainer(make_mlp(), args, train_dataset=ToyDataset(), loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[tracker])
    with caplog.at_level(logging.WARNING, logger="trainer"):
        state = trainer.fit()
    assert state.status == "completed" and state.global_step == 12
    assert tracker.writes == 2  # nothing more after the failure
    warnings = [r.getMessage() for r in caplog.records if "report_to broken failed" in r.getMessage()]
    assert warnings == ["report_to broken failed while logging (OSError: [Errno 28] No space left on device); "
                        "training goes on without it"]
    assert trainer.callbacks.state_dict()["Breaks"] == {"run_id": "r1"}


def test_curves_and_hyperparameters():
    assert curve_items({"step": 4, "loss": float("nan"), "eval_val_accuracy": 1, "flag": True}) == [("eval/val_accuracy", 1.0)]
    hp = hyperparameters(TrainingArguments(wandb_api_key="secret", label_names=["a"]))
    assert "wandb_api_key" not in hp and hp["label_names"] == "['a']" and hp["max_grad_norm"] == "None"


@pytest.mark.parametrize("report_to", [["tensorboard"], ["tqdm", "tensorboard"], ["visualdl"]])
def test_report_to_names_what_is_written_beside_metrics_jsonl(tmp_path, report_to):
    """Before: ``report_to=["tensorboard"]`` replaced the default loggers, so the run had no metrics.jsonl (which
    ``ptrain run``'s closing line and cli.md promised). Now metrics.jsonl is always written when report_to names
    anything, and report_to says what else: VisualDL only when named, the tracker when named."""
    if "tensorboard" in report_to:  # the README's test set-up has no tracker extra (.ci/run installs them)
        pytest.importorskip("tensorboardX", reason="tensorboardX (in the tensorboard extra) is not installed")
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, logging_steps=2, report_to=report_to,
                             save_strategy="no", evaluation_strategy="no")
    Trainer(make_mlp(), args, train_dataset=ToyDataset(32), loss_fn=paddle.nn.CrossEntropyLoss()).fit()
    with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
        assert [json.loads(line)["step"] for line in f] == [2, 4]
    assert os.path.isdir(tmp_path / "visualdl") == ("visualdl" in report_to)
    assert os.path.isdir(tmp_path / "tensorboard") == ("tensorboard" in report_to)


def test_report_to_none_writes_no_file(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, logging_steps=1, report_to=["none"],
                             save_strategy="no", evaluation_strategy="no")
    Trainer(make_mlp(), args, train_dataset=ToyDataset(16), loss_fn=paddle.nn.CrossEntropyLoss()).fit()
    assert not {"metrics.jsonl", "visualdl", "curves.png"} & set(os.listdir(tmp_path))
