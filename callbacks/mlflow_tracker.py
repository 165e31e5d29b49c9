"""MLflowTracker: ``report_to mlflow``, an MLflow run.

Switched on by ``report_to: [mlflow]`` (or ``all`` when installed; extra
``paddle-trainer[mlflow]``). Rank 0 only; events, failures and the run id:
:mod:`callbacks.tracking`. Uses ``mlflow.MlflowClient`` (no global active run).

Where: ``MLFLOW_TRACKING_URI`` when set (a server ``http://HOST:PORT``, a
database, or ``file:`` with ``MLFLOW_ALLOW_FILE_STORE=true``: MLflow 3 refuses
its file store otherwise); else a SQLite store ``logging_dir`` (default
``output_dir``) ``/mlflow.db`` with artifacts in ``.../mlartifacts`` (view:
``mlflow ui --backend-store-uri sqlite:///OUTPUT_DIR/mlflow.db``). Experiment
``MLFLOW_EXPERIMENT_NAME`` (default ``paddle-trainer``).

No network call unless the tracking URI names a server: MLflow's telemetry is
switched off (``MLFLOW_DISABLE_TELEMETRY=true`` unless you set it), and a
server's requests are retried at most twice, 5 s apart at most, each waiting at
most 30 s (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``..._BACKOFF_FACTOR``,
``..._TIMEOUT`` unless you set them), so a server that went away costs one
warning and seconds, not minutes.

What: run name ``run_name`` (default the output directory's name); the
arguments as params (values cut at 6,000 characters); every logged number as a
metric at ``step``; the exported model under the artifact path ``model``; a
file added after fit() (results.json) at the artifact root; the run's end as
its status (FINISHED, KILLED for a stopped or preempted run, FAILED).

Resume: the run id travels in the checkpoint and a resumed run logs into the
same run (status RUNNING again). Steps logged again after a resume are kept
beside the first values (MLflow keeps every value of a step).

State saved: ``run_id``.

    >>> MLflowTracker().name
    'mlflow'
"""

from __future__ import annotations

import os
import time
from typing import List, Optional, Tuple

from .tracking import Tracker, exported_model, hyperparameters, run_name, tracker_dir

_ENV_DEFAULTS = {"MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
_STATUS = {"completed": "FINISHED", "stopped": "KILLED", "preempted": "KILLED", "failed": "FAILED"}
_PARAM_MAX = 6000
_BATCH = 100  # params per log_batch call (MLflow's limit)


class MLflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, experiment: Optional[str] = None):
        super().__init__()
        self.experiment = experiment
        self.tracking_uri: Optional[str] = None
        self._client = None

    def _connect(self, trainer):
        for key, value in _ENV_DEFAULTS.items():  # before mlflow reads them (at import and per request)
            os.environ.setdefault(key, value)
        from mlflow import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
        local = not uri
        if local:
            root = tracker_dir(trainer)
            os.makedirs(root, exist_ok=True)
            uri = "sqlite:///" + os.path.join(root, "mlflow.db")
        self.tracking_uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        return local

    def start(self, trainer, resumed: bool) -> None:
        local = self._connect(trainer)
        client = self._client
        if resumed:
            client.update_run(self.run_id, status="RUNNING")
            return
        name = self.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME", "paddle-trainer")
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            where = "file://" + os.path.join(tracker_dir(trainer), "mlartifacts") if local else None
            experiment_id = client.create_experiment(name, artifact_location=where)
        run = client.create_run(experiment_id, run_name=run_name(trainer),
                                tags={"mlflow.source.name": "paddle-trainer", "output_dir": os.path.abspath(trainer.args.output_dir)})
        self.run_id = run.info.run_id
        from mlflow.entities import Param

        params = [Param(k, str(v)[:_PARAM_MAX]) for k, v in sorted(hyperparameters(trainer.args).items())]
        for i in range(0, len(params), _BATCH):
            client.log_batch(self.run_id, params=params[i:i + _BATCH])

    def scalars(self, items: List[Tuple[str, float]], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[Metric(tag, value, now, step) for tag, value in items])

    def finish(self, trainer, status: str) -> None:
        client = self._client
        model = exported_model(trainer)
        if model:
            client.log_artifacts(self.run_id, model, artifact_path="model")
        client.set_terminated(self.run_id, status=_STATUS.get(status, "FINISHED"))

    def attach(self, trainer, path: str, name: str) -> None:
        if self._client is None:
            self._connect(trainer)
        self._client.log_artifact(self.run_id, path)
