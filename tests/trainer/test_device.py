"""The device of each rank comes from the launcher's assignment (FLAGS_selected_gpus), decided once."""

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO, free_port
from patience import patience

from trainer.device import plan_device
from trainer.errors import ConfigError

WORKER = os.path.join(REPO, "tests", "distributed", "workers", "device_env.py")


def _launch(tmp_path, launch_args, device="auto", extra_env=None):
    """Run the worker under the real paddle.distributed.launch; return each rank's (env, place, log)."""
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "paddle.distributed.launch", *launch_args, "--master", f"127.0.0.1:{free_port()}",
           "--log_dir", str(tmp_path / "log"), WORKER, str(out), device]
    env = dict(os.environ, PYTHONPATH=REPO, **(extra_env or {}))
    env.pop("FLAGS_selected_gpus", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=patience(240), env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ranks = []
    for name in sorted(os.listdir(out)):
        with open(out / name) as f:
            record = json.load(f)
        rank = int(record["env"]["PADDLE_TRAINER_ID"])
        with open(tmp_path / "log" / f"workerlog.{rank}", errors="replace") as f:
            record["log"] = f.read()
        ranks.append(record)
    return ranks


def test_launcher_devices_pick_the_assigned_card(tmp_path):
    # The launcher believes CUDA_VISIBLE_DEVICES: with 8 cards listed, --devices 4,5 gives rank 0 card 4
    # and rank 1 card 5 through FLAGS_selected_gpus, exactly as on a GPU node.
    ranks = _launch(tmp_path, ["--devices", "4,5"], extra_env={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
    assert len(ranks) == 2
    for record in ranks:
        env, rank = record["env"], int(record["env"]["PADDLE_TRAINER_ID"])
        assert env["FLAGS_selected_gpus"] == str(4 + rank) and env["PADDLE_LOCAL_RANK"] == str(rank)
        assert plan_device(env, True, 8, "auto").place == f"gpu:{4 + rank}"  # not gpu:<local rank>
        assert plan_device(env, True, 8, "gpu").place == f"gpu:{4 + rank}"
        cpu = plan_device(env, True, 8, "cpu")  # device: cpu on a paddle-gpu build stays on CPU
        assert cpu.place == "cpu" and cpu.env == {"PADDLE_DISTRI_BACKEND": "gloo"}
        with pytest.raises(ConfigError, match="FLAGS_selected_gpus=5 names GPU 5 but paddle sees 4"):
            plan_device(dict(env, FLAGS_selected_gpus="5"), True, 4, "auto")


def test_one_process_on_card_3(tmp_path):
    (record,) = _launch(tmp_path, ["--devices", "3"], extra_env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert record["env"]["FLAGS_selected_gpus"] == "3"
    assert plan_device(record["env"], True, 4, "auto").place == "gpu:3"


def test_cpu_launch_stays_on_cpu_and_logs_each_rank(tmp_path):
    ranks = _launch(tmp_path, ["--nproc_per_node", "2"], device="cpu")
    assert len(ranks) == 2
    for record in ranks:
        env, rank = record["env"], int(record["env"]["PADDLE_TRAINER_ID"])
        assert record["place"] == "cpu"
        assert env["PADDLE_DISTRI_BACKEND"] == "gloo"  # what the launcher sets when it finds no device
        assert plan_device(env, True, 8, "cpu").env == {}  # already gloo: nothing to change
        assert plan_device(env, False, 0, "auto").place == "cpu"
        assert f"rank {rank} (local rank {rank}) trains on cpu" in record["log"]  # logged on every rank


def test_plain_python_and_errors():
    assert plan_device({}, True, 2, "auto").place == "gpu:0"  # paddle's default card
    assert plan_device({}, False, 0, "auto").place == "cpu"
    assert plan_device({}, True, 0, "auto").place == "cpu"
    with pytest.raises(ConfigError, match="device='gpu' but paddle sees no CUDA GPU"):
        plan_device({}, False, 0, "gpu")
    with pytest.raises(ConfigError, match="PADDLE_DISTRI_BACKEND=nccl"):
        plan_device({"PADDLE_TRAINERS_NUM": "2", "PADDLE_DISTRI_BACKEND": "nccl"}, True, 2, "cpu")
    with pytest.raises(ConfigError, match="not a list of GPU ids"):
        plan_device({"FLAGS_selected_gpus": "x"}, True, 2, "auto")
