"""``ptrain`` end to end, as a user runs it: real subprocesses, real files."""

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO


def ptrain(*args, cwd, timeout=240):
    return subprocess.run([sys.executable, "-m", "trainer.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=dict(os.environ, PYTHONPATH=REPO))


def test_list_shows_tasks_and_recipes(tmp_path):
    out = ptrain("list", cwd=tmp_path)
    assert out.returncode == 0
    assert "digits" in out.stdout and "recipes: demo" in out.stdout


def test_run_digits_writes_results_and_checkpoints(tmp_path):
    out = ptrain("run", "digits", "--output_dir", "run", "--num_train_epochs", "3", "--disable_tqdm", "true",
                 cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "completed" and results["test_accuracy"] > 0.8
    assert "eval_accuracy=" in out.stdout and "run directory:" in out.stdout
    # one set of names for a run's speed, as fit()'s state.train_metrics and PaddleNLP's train() have them
    assert results["train_runtime"] > 0 and results["train_samples_per_second"] > 0 and results["train_steps_per_second"] > 0
    assert "train_seconds" not in results
    ckpts = sorted(os.listdir(tmp_path / "run" / "checkpoints"))
    assert "latest" in ckpts
    inspect = ptrain("inspect", str(tmp_path / "run" / "checkpoints" / "latest"), cwd=tmp_path)
    assert inspect.returncode == 0 and "manifest: valid" in inspect.stdout
    listing = ptrain("inspect", str(tmp_path / "run"), cwd=tmp_path)
    assert listing.returncode == 0 and "<- latest" in listing.stdout
    latest = (tmp_path / "run" / "checkpoints" / "latest").read_text().strip()
    with open(tmp_path / "run" / "checkpoints" / latest / "model.safetensors", "r+b") as f:
        f.seek(-1, 2)
        f.write(b"\xff")
    damaged = ptrain("inspect", str(tmp_path / "run" / "checkpoints" / latest), cwd=tmp_path)
    assert damaged.returncode == 3 and "model.safetensors" in damaged.stdout


def test_dry_run_prints_arguments_and_callbacks_without_training(tmp_path):
    out = ptrain("run", "digits", "--dry_run", "--output_dir", "dry", "--learning_rate", "0.5", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert '"learning_rate": 0.5' in out.stdout and "on_step_end" in out.stdout
    assert not (tmp_path / "dry" / "checkpoints").exists()


def test_dry_run_loads_no_data_and_imports_no_dataset_library(tmp_path):
    # the command as ptrain runs it, in this process of a subprocess: what it imported is in sys.modules
    code = ("import sys; from trainer.cli.commands import main; "
            "code = main(['run', 'digits', '--dry_run', '--output_dir', 'dry']); "
            "print('IMPORTED ' + ' '.join(sorted(m for m in ('sklearn', 'scipy', 'paddlenlp', 'models.digits.data') "
            "if m in sys.modules))); sys.exit(code)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=240,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 0, out.stderr[-2000:]
    imported = next(line for line in out.stdout.splitlines() if line.startswith("IMPORTED"))
    # the data module is imported by the task module (it defines the dataset class); scikit-learn is not
    assert imported.split()[1:] in (["models.digits.data"], []), imported
    info = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("info: "))[6:])
    assert info["parameters"] > 0 and "train_samples" not in info
    assert "(datasets not built for a dry run)" in out.stdout.splitlines()


@pytest.mark.parametrize("args,code,message", [
    (["run", "digitz"], 2, "ptrain: error: unknown task 'digitz' (did you mean 'digits'?): known tasks are digits"),
    (["run", "digits", "--recipe", "nope"], 2, "ptrain: error: unknown recipe 'nope' for task digits: known recipes are demo"),
    (["run", "digits", "--learning_rate", "-1"], 2, "ptrain: error: learning_rate=-1.0 is not allowed: learning_rate must be a number >= 0"),
    (["run", "digits", "--max_steps", "ten"], 2, "ptrain: error: max_steps='ten' is not allowed: max_steps must be an integer"),
    (["run", "digits", "--amp", "fp8"], 2, "ptrain: error: amp='fp8' is not allowed: choose one of off, fp16, bf16"),
    (["run", "digits", "--learning_rat", "0.1"], 2, "did you mean 'learning_rate'?"),
    (["run", "digits", "--hidden_size", "0"], 2, "ptrain: error: hidden_size=0 is not allowed"),
    (["run", "digits", "--resume_from_checkpoint", "/nope", "--max_steps", "1"], 2, "resume_from_checkpoint='/nope' does not exist"),
    (["inspect", "/nope"], 2, "ptrain: error: /nope does not exist: give a checkpoint directory or a run's output_dir"),
])
def test_bad_input_is_one_line_and_a_documented_exit_code(tmp_path, args, code, message):
    out = ptrain(*args, cwd=tmp_path)
    assert out.returncode == code, out.stderr
    lines = [l for l in out.stderr.splitlines() if l.startswith("ptrain:")]
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_bad_yaml_config_names_file_and_line(tmp_path):
    (tmp_path / "bad.yaml").write_text("learning_rate: 0.1\n  max_steps: 3\n")
    out = ptrain("run", "digits", "--config", "bad.yaml", cwd=tmp_path)
    assert out.returncode == 2 and "bad.yaml line 2: YAML does not parse" in out.stderr


def test_unknown_key_in_config_file_names_that_file(tmp_path):
    (tmp_path / "extra.yaml").write_text("learning_rat: 0.1\n")
    out = ptrain("run", "digits", "--config", "extra.yaml", cwd=tmp_path)
    assert out.returncode == 2 and "unknown training argument 'learning_rat' in extra.yaml (did you mean 'learning_rate'?)" in out.stderr


def test_debug_shows_the_traceback(tmp_path):
    out = ptrain("run", "digits", "--learning_rate", "-1", "--debug", cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_run_with_two_processes_through_paddle_launch(tmp_path):
    out = ptrain("run", "digits", "--nproc", "2", "--output_dir", "dp", "--num_train_epochs", "2",
                 "--save_strategy", "no", "--disable_tqdm", "true", "--skip_memory_metrics", "false",
                 "--eval_accumulation_steps", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "paddle.distributed.launch" in out.stderr
    results = json.loads((tmp_path / "dp" / "results.json").read_text())
    assert results["status"] == "completed" and results["eval_samples"] == 270  # eval outputs moved to the host every 2
    peaks = results["peak_memory_per_rank"]["peak_host_rss_mb"]  # each rank's, in rank order
    assert len(peaks) == 2 and all(p > 50 for p in peaks)
    logged = [json.loads(line) for line in (tmp_path / "dp" / "metrics.jsonl").read_text().splitlines()]
    train_logs = [r for r in logged if "loss" in r]
    assert train_logs and all(r["peak_host_rss_mb"] >= max(peaks) * 0.5 for r in train_logs)  # the max over ranks
    assert sorted(f for f in os.listdir(tmp_path / "dp" / "launch_logs") if f.startswith("workerlog")) == ["workerlog.0", "workerlog.1"]


def test_import_is_light():
    code = "import sys, trainer, callbacks; from trainer import Trainer; import callbacks.logger; " \
           "print('paddlenlp' in sys.modules, 'visualdl' in sys.modules, 'matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.split() == ["False", "False", "False"], out.stderr
