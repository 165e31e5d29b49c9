"""report_to mlflow, read back with MlflowClient: against a real ``mlflow server`` (SQLite store) started here
on 127.0.0.1, the file store, and the default SQLite file in output_dir; a resumed run logs into the same
MLflow run; a server killed mid-run costs one warning and never stops training."""

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers import free_port  # noqa: E402
from tracker_runs import logged, tracker, train, write_results  # noqa: E402

from callbacks import Callback  # noqa: E402

pytest.importorskip("mlflow", reason="the mlflow extra is not installed: pip install 'paddle-trainer[mlflow]'")

from callbacks.mlflow_tracker import _ENV_DEFAULTS, MLflowTracker  # noqa: E402


@pytest.fixture
def mlflow_env(monkeypatch):
    """The tracker's environment defaults, restored after the test; no URI or experiment from outside."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in _ENV_DEFAULTS.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """``mlflow server`` with a SQLite store on a free port of 127.0.0.1, one for this file (it takes a minute or
    more to start on a busy machine); the last test kills it; stopped (its process group) at the end."""
    tmp_path = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                             f"sqlite:///{tmp_path / 'server.db'}", "--artifacts-destination",
                             (tmp_path / "server-artifacts").as_uri(), "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240  # generous: the machine is shared
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            log.close()
            pytest.fail(f"mlflow server did not start: {(tmp_path / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    yield proc, url
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log.close()


@pytest.fixture
def server(mlflow_server, mlflow_env):
    proc, url = mlflow_server
    assert proc.poll() is None, "the mlflow server is gone (the test that kills it runs last)"
    mlflow_env.setenv("MLFLOW_TRACKING_URI", url)
    return proc, url


def client(uri):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def history(c, run_id, key):
    return {m.step: m.value for m in c.get_metric_history(run_id, key)}


def artifacts(c, run_id, path=None):
    return sorted(a.path for a in c.list_artifacts(run_id, path))


def test_server_run_reads_back_and_a_resume_continues_the_same_run(tmp_path, server):
    _, url = server
    out = tmp_path / "run"
    first = train(out, ["mlflow"], stop_at=6, run_name="exp1")
    run_id = tracker(first, MLflowTracker).run_id
    c = client(url)
    run = c.get_run(run_id)
    assert run.info.status == "KILLED" and run.info.run_name == "exp1"  # stopped at 6 of 8
    assert run.data.params["learning_rate"] == "0.05" and "wandb_api_key" not in run.data.params
    assert history(c, run_id, "train/loss") == pytest.approx(logged(first, "loss"), rel=1e-6)
    assert "model.json" in " ".join(artifacts(c, run_id, "model"))

    second = train(out, ["mlflow"], resume="auto", run_name="exp1")
    assert tracker(second, MLflowTracker).run_id == run_id  # the same MLflow run
    write_results(second)
    run = c.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert history(c, run_id, "train/loss") == pytest.approx(logged(first, "loss") | logged(second, "loss"), rel=1e-6)
    assert history(c, run_id, "eval/loss")[8] == pytest.approx(second.state.metrics["eval_loss"], rel=1e-6)
    assert run.data.metrics["eval/loss"] == pytest.approx(second.state.metrics["eval_loss"], rel=1e-6)
    assert "results.json" in artifacts(c, run_id)
    assert len(c.search_runs([run.info.experiment_id])) == 1


def test_file_store_reads_back(tmp_path, mlflow_env):
    uri = (tmp_path / "mlruns").as_uri()
    mlflow_env.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow_env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses its file store without it
    mlflow_env.setenv("MLFLOW_EXPERIMENT_NAME", "files")
    trainer = train(tmp_path / "run", ["mlflow"], max_steps=6)
    c = client(uri)
    run = c.get_run(tracker(trainer, MLflowTracker).run_id)
    assert run.info.status == "FINISHED" and c.get_experiment(run.info.experiment_id).name == "files"
    assert history(c, run.info.run_id, "eval/loss") == pytest.approx(logged(trainer, "eval_loss"), rel=1e-6)


def test_default_is_a_sqlite_file_under_logging_dir(tmp_path, mlflow_env):
    trainer = train(tmp_path / "run", ["mlflow"], max_steps=4, logging_dir=str(tmp_path / "logs"))
    mlflow = tracker(trainer, MLflowTracker)
    assert mlflow.tracking_uri == f"sqlite:///{tmp_path / 'logs' / 'mlflow.db'}"
    c = client(mlflow.tracking_uri)
    assert history(c, mlflow.run_id, "train/loss") == pytest.approx(logged(trainer, "loss"), rel=1e-6)
    assert "model.json" in " ".join(artifacts(c, mlflow.run_id, "model"))
    assert os.path.isdir(tmp_path / "logs" / "mlartifacts")


class KillServer(Callback):
    """Kills the tracking server at the end of step ``step``."""

    def __init__(self, proc, step):
        self.proc, self.step = proc, step

    def on_step_end(self, trainer):
        if trainer.state.global_step == self.step and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def test_a_server_killed_mid_run_costs_one_warning_and_training_finishes(tmp_path, server, caplog):
    """Last in this file: it kills the file's server."""
    proc, _ = server
    with caplog.at_level(logging.WARNING, logger="trainer"):
        trainer = train(tmp_path / "run", ["mlflow"], callbacks=[KillServer(proc, 3)])
    assert trainer.state.status == "completed" and trainer.state.global_step == 8
    warnings = [r.getMessage() for r in caplog.records if "report_to mlflow failed" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "training goes on without it" in warnings[0]
