"""Helpers of the PaddleFormers tests (run in an environment with paddleformers and without paddlenlp):
the shared fine-tuning script (``scripts/pf_finetune.py``: a tiny random Llama or ERNIE 4.5, full or
LoRA) run as written, with PaddleFormers' Trainer, or with only its ``Trainer`` import changed, in a
subprocess on one process or under ``paddle.distributed.launch`` on two.

Other helpers add small functions at the end of this file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SCRIPTS = os.path.join(HERE, "scripts")
FINETUNE = os.path.join(SCRIPTS, "pf_finetune.py")
THEIR_IMPORT = "from paddleformers.trainer import Trainer\n"
OUR_IMPORT = "from trainer import Trainer\n"

#: arguments every run of the script gets: a few steps, a log record at each, PaddleFormers' CPU needs
#: (amp_master_grad off: its default True raises without AMP), no checkpoints, no reporting integrations
BASE_ARGS = ["--per_device_train_batch_size", "4", "--max_steps", "6", "--logging_steps", "1",
             "--learning_rate", "2e-3", "--warmup_steps", "2", "--weight_decay", "0.01",
             "--amp_master_grad", "false", "--save_strategy", "no", "--report_to", "none", "--seed", "7",
             "--device", "cpu", "--disable_tqdm", "true"]


def script_source(ours: bool, script: str = FINETUNE) -> str:
    """The script's text; with ``ours`` its one ``Trainer`` import changed to ours."""
    with open(script, encoding="utf-8") as f:
        text = f.read()
    assert text.count(THEIR_IMPORT) == 1, f"{script} must import PaddleFormers' Trainer on a line of its own"
    return text.replace(THEIR_IMPORT, OUR_IMPORT) if ours else text


def env() -> dict:
    """The environment of a run: this checkout importable (the project is not installed beside paddleformers)."""
    return dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")


def run_script(tmp, name: str, ours: bool, argv: list, nproc: int = 1, script: str = FINETUNE,
               timeout: int = 600) -> str:
    """Run the script (``ours``: with our Trainer) with ``argv`` and ``--output_dir <tmp>/<name>``; returns that
    directory. ``nproc`` > 1: under ``python -m paddle.distributed.launch`` (its logs in ``<tmp>/<name>-logs``)."""
    path = os.path.join(str(tmp), f"{name}.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(script_source(ours, script))
    out = os.path.join(str(tmp), name)
    args = [*map(str, argv), "--output_dir", out]
    if nproc > 1:
        from helpers import free_port, run_launch

        logs = os.path.join(str(tmp), f"{name}-logs")
        cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
               "--master", f"127.0.0.1:{free_port()}", "--log_dir", logs, path, *args]
        # launched again only after a failure of paddle's own (its group rendezvous raced, or a rank died of a
        # signal with nothing in its log: seen in CI at a rank's exit, after the script had written everything),
        # each attempt from an empty output directory
        proc = run_launch(cmd, logs, env(), timeout, cwd=str(tmp),
                          before_retry=lambda: shutil.rmtree(out, ignore_errors=True))
    else:
        logs, cmd = None, [sys.executable, path, *args]
        proc = subprocess.run(cmd, cwd=str(tmp), env=env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        detail = proc.stderr[-3000:]
        if logs:
            for i in range(nproc):
                log = os.path.join(logs, f"workerlog.{i}")
                if os.path.exists(log):
                    with open(log, encoding="utf-8", errors="replace") as f:
                        detail += f"\n--- workerlog.{i}\n" + f.read()[-3000:]
        raise AssertionError(f"{name} failed ({proc.returncode}):\n{detail}")
    return out


def read_logs(out: str) -> dict:
    """What the script wrote: ``logs`` (every on_log record), ``hooks``, ``global_step``, ``training_loss``,
    ``metrics``."""
    with open(os.path.join(out, "logs.json"), encoding="utf-8") as f:
        return json.load(f)


def read_state(out: str) -> dict:
    with open(os.path.join(out, "trainer_state.json"), encoding="utf-8") as f:
        return json.load(f)
