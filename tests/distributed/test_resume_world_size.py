"""A 2-process num_train_epochs run stopped mid-epoch and resumed on 1 process follows the uninterrupted
run's schedule (same max steps, same warmup, the final LR reached) and sees every sample once per epoch."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO, launch
from patience import patience

from trainer import ConfigError, TrainingArguments

WORKER = os.path.join(REPO, "tests", "distributed", "workers", "resume_ws_toy.py")
STOP = 8  # epoch 1, step 2 of 6 (96 samples, global batch 16)


def _result(out, tag, rank=0):
    with open(os.path.join(out, f"result-{tag}-rank{rank}.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("ws")
    full, part = str(base / "full"), str(base / "part")
    launch(WORKER, [full, "full"], 2, str(base / "log-full"))
    launch(WORKER, [part, "part", STOP], 2, str(base / "log-part"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "FLAGS_"))}
    env["PYTHONPATH"] = REPO
    proc = subprocess.run([sys.executable, WORKER, part, "resumed", "0", "auto"], capture_output=True, text=True,
                          timeout=patience(240), cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return full, part, proc.stderr


def test_resume_on_one_process_keeps_the_uninterrupted_schedule(runs):
    full, part, log = runs
    a, b, c = _result(full, "full"), _result(part, "part"), _result(part, "resumed")
    assert b["global_step"] == STOP and b["status"] == "stopped"
    assert "gradient_accumulation_steps 1 -> 2 keeps the global batch at 16" in log
    assert c["accumulation"] == 2
    assert c["max_steps"] == a["max_steps"] == 18
    assert c["warmup_steps"] == a["warmup_steps"] == 4
    assert c["global_step"] == 18 and c["status"] == "completed"
    lr_full = {int(k): v for k, v in a["lr"].items()}
    lr_resumed = {int(k): v for k, v in c["lr"].items()}
    for step in range(STOP + 1, 19):
        assert lr_resumed[step] == pytest.approx(lr_full[step], rel=1e-12, abs=1e-15), step
    assert lr_resumed[18] == 0.0  # the final LR is reached
    p_full = np.load(os.path.join(full, "params-full-rank0.npz"))
    p_res = np.load(os.path.join(part, "params-resumed-rank0.npz"))
    for k in p_full.files:
        np.testing.assert_allclose(p_res[k], p_full[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_a_relaunch_with_the_original_flags_keeps_the_accumulation_set_for_the_new_world_size(runs, tmp_path):
    import shutil

    _, part, _ = runs
    again = str(tmp_path / "again")
    shutil.copytree(part, again)
    with open(os.path.join(again, "checkpoints", "latest")) as f:
        assert f.read().strip() == "step-18"
    os.remove(os.path.join(again, "checkpoints", "latest"))
    shutil.rmtree(os.path.join(again, "checkpoints", "step-18"))  # resume the 1-process run's own step-12
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "FLAGS_"))}
    env["PYTHONPATH"] = REPO
    proc = subprocess.run([sys.executable, WORKER, again, "again", "0", "auto"], capture_output=True, text=True,
                          timeout=patience(240), cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = _result(again, "again")
    assert result["accumulation"] == 2 and result["global_step"] == 18 and result["max_steps"] == 18


def test_every_sample_is_seen_once_per_epoch_from_the_resumed_position(runs):
    _, part, _ = runs
    per_rank_step = 8
    seen_before = []
    for rank in (0, 1):  # epoch 1's first 2 steps, on each of the 2 ranks
        fetched = _result(part, "part", rank)["fetched"]
        seen_before += fetched[6 * per_rank_step:STOP * per_rank_step]
    resumed = _result(part, "resumed")["fetched"]
    rest_of_epoch_1, epoch_2 = resumed[:96 - len(seen_before)], resumed[96 - len(seen_before):]
    assert sorted(seen_before + rest_of_epoch_1) == list(range(96))
    assert sorted(epoch_2) == list(range(96))


def test_three_processes_for_a_two_process_checkpoint_get_working_choices(runs):
    from trainer.checkpoint.resume import plan_world_size, read_meta

    _, part, _ = runs
    meta = read_meta(os.path.join(part, "checkpoints", f"step-{STOP}"))
    for batch in (8, 3):
        args = TrainingArguments(output_dir=part, per_device_train_batch_size=batch)
        with pytest.raises(ConfigError) as err:
            plan_world_size(args, meta, 3)
        text = str(err.value)
        assert "in []" not in text and "use " in text, text
        assert "2 processes as before" in text
    args = TrainingArguments(output_dir=part, per_device_train_batch_size=8)
    with pytest.raises(ConfigError, match=r"use 1 or 2 processes with per_device_train_batch_size 8; or 2 processes as "
                                          r"before"):
        plan_world_size(args, meta, 3)
    args = TrainingArguments(output_dir=part, per_device_train_batch_size=3)
    with pytest.raises(ConfigError, match=r"per_device_train_batch_size 3 cannot reach it by accumulation: use 2 "
                                          r"processes as before$"):
        plan_world_size(args, meta, 3)
