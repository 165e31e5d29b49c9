"""An output_dir holds one run's checkpoints: a fresh run is refused or overwrites; rotation and auto see only theirs."""

import json
import os
import shutil
import subprocess
import sys

import paddle
import pytest
from helpers import REPO, ToyDataset, make_mlp
from patience import patience

from trainer import ConfigError, Trainer, TrainingArguments
from trainer.errors import cli_terms
from trainer.checkpoint.manifest import checkpoint_run_id
from trainer.checkpoint.store import resolve
from trainer.checkpoint.lock import JOB_ENV, LOCK_NAME


def run(out, resume=None, **kw):
    args = dict(output_dir=str(out), max_steps=4, save_steps=2, report_to=[], evaluation_strategy="no",
                save_async=False)
    args.update(kw)
    trainer = Trainer(make_mlp(), TrainingArguments(**args), train_dataset=ToyDataset(64),
                      loss_fn=paddle.nn.CrossEntropyLoss())
    return trainer.fit(resume_from_checkpoint=resume)


def steps(out):
    root = os.path.join(str(out), "checkpoints")
    return sorted(int(n[5:]) for n in os.listdir(root) if n.startswith("step-"))


def test_fresh_run_into_an_earlier_runs_checkpoints_is_refused(tmp_path):
    run(tmp_path)
    assert steps(tmp_path) == [2, 4]
    # a Python caller is told the keywords to pass; ptrain (cli_terms) the flags
    with pytest.raises(ConfigError, match=rf"output_dir {tmp_path} holds checkpoints of an earlier run \(newest "
                                          r'step-4\): continue it with resume_from_checkpoint="auto", start afresh '
                                          r"with overwrite_output_dir=True, or use another output_dir$"):
        run(tmp_path, max_steps=2)
    with cli_terms(), pytest.raises(ConfigError, match=r"continue it with --resume_from_checkpoint auto, start afresh "
                                                       r"with --overwrite_output_dir true, or use another --output_dir$"):
        run(tmp_path, max_steps=2)
    assert steps(tmp_path) == [2, 4] and not (tmp_path / LOCK_NAME).exists()


def test_overwrite_output_dir_starts_afresh(tmp_path):
    run(tmp_path, max_steps=6)
    old = checkpoint_run_id(str(tmp_path / "checkpoints" / "step-6"))
    state = run(tmp_path, max_steps=2, overwrite_output_dir=True)
    assert state.status == "completed" and steps(tmp_path) == [2]
    assert checkpoint_run_id(str(tmp_path / "checkpoints" / "step-2")) == state.run_id != old
    assert [n for n in os.listdir(tmp_path) if n.startswith(".checkpoints-")] == []


def test_an_overwrite_killed_midway_is_finished_by_the_next_run(tmp_path):
    aside = tmp_path / ".checkpoints-overwritten-abc" / "step-9"
    aside.mkdir(parents=True)
    (aside / "model.safetensors").write_bytes(b"x" * 100)
    run(tmp_path, max_steps=2)
    assert not (tmp_path / ".checkpoints-overwritten-abc").exists()


def test_rotation_and_auto_only_see_the_current_runs_checkpoints(tmp_path):
    """Before: another run's step-60 counted as newest; rotation deleted the new run's latest, and auto
    fell back to the other run."""
    other, mine = tmp_path / "other", tmp_path / "mine"
    run(other, max_steps=6, save_steps=6)
    run(mine, max_steps=4)  # run b: step-2, step-4
    shutil.copytree(other / "checkpoints" / "step-6", mine / "checkpoints" / "step-60")  # run a, a higher step
    b = checkpoint_run_id(str(mine / "checkpoints" / "step-4"))
    assert checkpoint_run_id(str(mine / "checkpoints" / "step-60")) != b

    state = run(mine, resume="auto", max_steps=6, save_total_limit=1)
    assert state.global_step == 6 and state.run_id == b  # resumed run b, continues its id
    assert steps(mine) == [6, 60]  # b's older ones rotated away, its newest kept; a's untouched
    assert (mine / "checkpoints" / "latest").read_text().strip() == "step-6"
    assert checkpoint_run_id(str(mine / "checkpoints" / "step-6")) == b

    # latest's checkpoint damaged: auto falls back within run b, never to run a's step-60
    run(mine, resume="auto", max_steps=8, save_steps=8)  # b: step-8 (and step-6)
    with open(mine / "checkpoints" / "step-8" / "model.safetensors", "r+b") as f:
        f.write(b"garbage!")
    assert resolve("auto", str(mine)) == str(mine / "checkpoints" / "step-6")


def _ptrain(*argv):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in (JOB_ENV, "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_JOB_ID"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "trainer.cli", "run", "digits", *argv], capture_output=True,
                          text=True, timeout=patience(300), env=env, cwd=REPO)


def test_ptrain_refuses_a_fresh_run_in_one_line_and_overwrites_when_asked(tmp_path):
    common = ["--output_dir", str(tmp_path), "--save_strategy", "steps", "--save_steps", "2", "--evaluation_strategy", "no",
              "--report_to", "jsonl"]
    run(tmp_path, max_steps=6)  # an earlier run: step-2, 4, 6
    (tmp_path / "results.json").write_text(json.dumps({"global_step": 6}))
    again = _ptrain(*common, "--max_steps", "4")
    assert again.returncode == 2
    assert again.stderr.strip().count("\n") == 0 and "--overwrite_output_dir" in again.stderr, again.stderr
    assert json.loads((tmp_path / "results.json").read_text())["global_step"] == 6  # the first run's, untouched
    fresh = _ptrain(*common, "--max_steps", "4", "--overwrite_output_dir", "true")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert max(steps(tmp_path)) == 4  # the first run's step-6 is gone (the recipe may keep only the newest)
    assert json.loads((tmp_path / "results.json").read_text())["global_step"] == 4


def test_a_second_fit_of_the_same_trainer_continues_its_run(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, save_steps=2, report_to=[],
                             evaluation_strategy="no", save_async=False)
    trainer = Trainer(make_mlp(), args, train_dataset=ToyDataset(64), loss_fn=paddle.nn.CrossEntropyLoss())
    first = trainer.fit().run_id
    trainer.args.max_steps = 4
    assert trainer.fit().global_step == 4 and trainer.state.run_id == first
    assert {checkpoint_run_id(str(tmp_path / "checkpoints" / f"step-{s}")) for s in (2, 4)} == {first}
