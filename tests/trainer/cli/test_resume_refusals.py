"""Resume refusals as ``ptrain`` users meet them (issue 19, items 3 and 10): a task option that changes the
model or the split is refused in one line naming it and both values; an early refusal prints no second error;
``ptrain inspect OUTPUT_DIR`` exits 3 when no checkpoint in it can be resumed."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import REPO

from trainer.errors import ConfigError
from trainer.task import Task


def ptrain(*args, cwd, timeout=240):
    return subprocess.run([sys.executable, "-m", "trainer.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=dict(os.environ, PYTHONPATH=REPO))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    where = tmp_path_factory.mktemp("refusals")
    done = ptrain("run", "digits", "--output_dir", "run", "--max_steps", "10", "--save_steps", "10",
                  "--evaluation_strategy", "no", "--disable_tqdm", "true", cwd=where)
    assert done.returncode == 0, done.stderr
    return where / "run"


def resume(base, tmp_path, *flags):
    run = tmp_path / "run"
    shutil.copytree(base, run)
    done = ptrain("run", "digits", "--output_dir", str(run), "--max_steps", "20", "--evaluation_strategy", "no",
                  "--disable_tqdm", "true", *flags, cwd=tmp_path)
    return done, run


def error_lines(stderr):
    return [line for line in stderr.splitlines() if "error" in line.lower()]


@pytest.mark.parametrize("flag,old,new,what", [
    ("--split_seed", "0", "1", "which samples are train, eval and test"),
    ("--dropout", "0.0", "0.5", "what is trained"),
])
def test_a_changed_task_option_is_refused_naming_it(base, tmp_path, flag, old, new, what):
    done, run = resume(base, tmp_path, "--resume_from_checkpoint", "auto", flag, new)
    assert done.returncode == ConfigError.exit_code, done.stderr
    name = flag[2:]
    (line,) = error_lines(done.stderr)
    assert f"resume: {name} (task digits) was {old} in checkpoint" in line and f"this run has {new}" in line, line
    assert what in line and f"resume with {flag} {old}, or start a fresh run" in line  # the flag, as typed
    assert sorted(n for n in os.listdir(run / "checkpoints") if n.startswith("step-")) == ["step-10"]


def test_an_early_refusal_prints_one_error(base, tmp_path):
    done, _ = resume(base, tmp_path, "--resume_from_checkpoint", "auto", "--per_device_train_batch_size", "7")
    assert done.returncode == ConfigError.exit_code
    (line,) = error_lines(done.stderr)
    assert "per_device_train_batch_size was" in line and "Preemption" not in done.stderr, done.stderr
    assert "resume with --per_device_train_batch_size 32, or start a fresh run" in line, line


def test_a_format_it_cannot_read_is_refused_with_one_error(base, tmp_path):
    shutil.copytree(base, tmp_path / "src")
    manifest = tmp_path / "src" / "checkpoints" / "step-10" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["format_version"] = 999
    manifest.write_text(json.dumps(doc))
    done = ptrain("run", "digits", "--output_dir", "new", "--max_steps", "20", "--disable_tqdm", "true",
                  "--resume_from_checkpoint", str(manifest.parent), cwd=tmp_path)
    assert done.returncode == 3
    (line,) = error_lines(done.stderr)
    assert "format_version 999" in line and "Preemption" not in done.stderr, done.stderr


def test_inspect_exits_3_when_no_checkpoint_can_be_resumed(base, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(base, run)
    assert ptrain("inspect", str(run), cwd=tmp_path).returncode == 0
    with open(run / "checkpoints" / "step-10" / "optimizer.safetensors", "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    done = ptrain("inspect", str(run), cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "no checkpoint in" in done.stderr and "would start fresh" in done.stderr
    assert os.path.isdir(run / "checkpoints" / "step-10")  # inspect only reads: nothing is set aside


def test_a_split_option_can_never_be_allowed_to_change():
    with pytest.raises(ConfigError, match="split_seed.*never change"):
        Task(name="t", description="", options_class=object, build=None, recipes_dir="",
             resume_may_change={"split_seed": "because"})
