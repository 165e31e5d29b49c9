"""WandbTracker: ``report_to wandb``, a Weights & Biases run.

Switched on by ``report_to: [wandb]`` (or ``all`` when installed; extra
``paddle-trainer[wandb]``). Rank 0 only; events, failures and the run id:
:mod:`callbacks.tracking`.

Offline unless you say otherwise: ``WANDB_MODE`` is used as set; when it is not
set, the run is ``online`` only when an API key is known (``wandb_api_key``,
``WANDB_API_KEY``, or a ``wandb login`` entry in ``~/.netrc`` for
``WANDB_BASE_URL``'s host) and ``offline`` otherwise: no network call, the run
is written under ``logging_dir`` (default ``output_dir``) ``/wandb/offline-run-*``
and uploaded later with ``wandb sync DIR``. ``wandb_api_key`` is handed to wandb
(``wandb.Settings(api_key=...)``), never logged as a hyper-parameter.

What: project ``WANDB_PROJECT`` (default ``paddle-trainer``), name ``run_name``
(default the output directory's name); the arguments as the run's config; every
logged number at ``step``; the final value of every key in the run's summary;
the exported model (``callbacks.Export``) as a ``model`` artifact; a file added
after fit() (``ptrain run``'s results.json) as an artifact of the same run.

Resume: the run id travels in the checkpoint, and a resumed run calls
``wandb.init(id=..., resume="allow")``: the same W&B run (offline, a second
``offline-run-*`` directory holding the same run id, which ``wandb sync``
appends). Online, W&B ignores steps at or below the run's last step: the steps
between the checkpoint and the interruption keep the values logged first.

Complete when fit() returns: ``run.finish()`` can return before wandb's service
has written the run file's tail (seen here: 98,304 of 101,247 bytes), so after
it the service is shut down with ``wandb.teardown()`` (which waits for it to
close the file) unless another wandb run of the process is still open.

State saved: ``run_id``.

    >>> WandbTracker().name
    'wandb'
"""

from __future__ import annotations

import netrc
import os
from typing import List, Optional, Tuple
from urllib.parse import urlparse

from .tracking import Tracker, exported_model, final_metrics, hyperparameters, run_name, tracker_dir


def wandb_mode(api_key: Optional[str]) -> str:
    """``WANDB_MODE`` when set; else ``online`` with a known API key, ``offline`` without."""
    mode = os.environ.get("WANDB_MODE", "").strip()
    if mode:
        return mode
    return "online" if api_key or os.environ.get("WANDB_API_KEY") or _netrc_has_key() else "offline"


def _netrc_has_key() -> bool:
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, project: Optional[str] = None):
        super().__init__()
        self.project = project
        self.mode: Optional[str] = None
        self.run_dir: Optional[str] = None  # this fit()'s run directory (offline: wandb/offline-run-*)
        self._run = None

    def _init(self, trainer, config: Optional[dict]):
        import wandb

        key = trainer.args.wandb_api_key
        self.mode = wandb_mode(key)
        root = tracker_dir(trainer)
        os.makedirs(root, exist_ok=True)
        settings = wandb.Settings(mode=self.mode, **({"api_key": key} if key else {}))
        run = wandb.init(project=self.project or os.environ.get("WANDB_PROJECT", "paddle-trainer"),
                         name=run_name(trainer), id=self.run_id, resume="allow" if self.run_id else None,
                         dir=root, config=config, settings=settings, reinit="create_new")
        self.run_id = run.id
        self.run_dir = os.path.dirname(run.settings.sync_file) if getattr(run.settings, "sync_file", None) else None
        return run

    def start(self, trainer, resumed: bool) -> None:
        self._run = self._init(trainer, None if resumed else hyperparameters(trainer.args))

    def scalars(self, items: List[Tuple[str, float]], step: int) -> None:
        self._run.log(dict(items), step=step)

    def finish(self, trainer, status: str) -> None:
        import wandb

        run, self._run = self._run, None
        run.summary.update({**final_metrics(trainer), "status": status})
        model = exported_model(trainer)
        if model:
            artifact = wandb.Artifact(f"model-{run.id}", type="model")
            artifact.add_dir(model)
            run.log_artifact(artifact)
        self._close(run, 0 if status != "failed" else 1)

    def attach(self, trainer, path: str, name: str) -> None:
        import wandb

        self.run_dir = None
        run = self._init(trainer, None)  # the same run, reopened (resume="allow")
        artifact = wandb.Artifact(f"{name.replace('.', '-')}-{run.id}", type="results")
        artifact.add_file(path, name=name)
        run.log_artifact(artifact)
        self._close(run, 0)

    @staticmethod
    def _close(run, exit_code: int) -> None:
        import wandb

        run.finish(exit_code=exit_code)
        if wandb.run is None:  # no other run of this process open: wait for the service to write everything
            wandb.teardown()

    def _after_failure(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            try:
                run.finish(exit_code=1)
            except Exception:  # noqa: BLE001 - already warned once
                pass
