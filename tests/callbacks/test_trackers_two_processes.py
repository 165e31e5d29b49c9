"""The trackers under two processes (paddle's launcher, CPU): rank 0 alone writes, one run per tracker, holding
the loss averaged over the ranks (what metrics.jsonl holds)."""

import glob
import importlib.util
import json
import os

import pytest
from helpers import launch

MISSING = [m for m in ("tensorboardX", "wandb", "mlflow") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"tracker extras not installed ({', '.join(MISSING)}): "
                                "pip install 'paddle-trainer[tensorboard,wandb,mlflow]'")

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = '''
import sys
sys.path.append(%r)
import paddle
from helpers import ToyDataset, make_mlp
from trainer import Trainer, TrainingArguments

args = TrainingArguments(output_dir=sys.argv[1], max_steps=6, logging_steps=2, report_to=["jsonl", "tensorboard", "wandb",
                         "mlflow"], per_device_train_batch_size=8, evaluation_strategy="no", save_strategy="no", device="cpu")
Trainer(make_mlp(), args, train_dataset=ToyDataset(), loss_fn=paddle.nn.CrossEntropyLoss()).fit()
'''


def test_rank0_alone_writes_one_run_per_tracker(tmp_path, monkeypatch):
    for name in ("WANDB_API_KEY", "WANDB_MODE", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: wandb offline
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    script = tmp_path / "two.py"
    script.write_text(SCRIPT % TESTS)
    out = tmp_path / "out"
    launch(str(script), [str(out)], nproc=2, log_dir=str(tmp_path / "launch_logs"))
    with open(out / "metrics.jsonl") as f:
        loss = {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}
    assert sorted(loss) == [2, 4, 6]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert len(glob.glob(str(tmp_path / "**" / "events.out.tfevents.*"), recursive=True)) == 1
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert {e.step: e.value for e in events.Scalars("train/loss")} == pytest.approx(loss, rel=1e-6)

    assert len(glob.glob(str(tmp_path / "**" / "offline-run-*"), recursive=True)) == 1

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient

    client = MlflowClient((tmp_path / "mlruns").as_uri())
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    history = {m.step: m.value for m in client.get_metric_history(runs[0].info.run_id, "train/loss")}
    assert history == pytest.approx(loss, rel=1e-6)
