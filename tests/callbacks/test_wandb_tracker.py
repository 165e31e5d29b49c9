"""report_to wandb, offline (no API key, no network): real runs read back from wandb's own run files with
wandb's reader (``wandb leet inspect --json``), complete the moment fit() returns; a resumed run is the same
W&B run; results.json added after fit() lands in that run too."""

import glob
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tracker_runs import logged, tracker, train, write_results  # noqa: E402

pytest.importorskip("wandb", reason="the wandb extra is not installed: pip install 'paddle-trainer[wandb]'")

from callbacks.wandb_tracker import WandbTracker, wandb_mode  # noqa: E402


@pytest.fixture
def no_key(tmp_path, monkeypatch):
    """No API key anywhere (environment, ~/.netrc) and WANDB_MODE unset: the tracker must choose offline."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_BASE_URL", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    os.makedirs(tmp_path / "home", exist_ok=True)


def records(run_dir):
    """The records of a run's .wandb file, by wandb's own reader."""
    proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", run_dir],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def of_type(recs, kind):
    return [r[kind] for r in recs if r["type"] == kind]


def history(recs, key):
    return {h["step"]["num"]: h["item"][key] for h in of_type(recs, "history") if key in h["item"]}


def test_offline_run_reads_back_complete_and_a_resume_continues_the_same_run(tmp_path, no_key):
    out = tmp_path / "run"
    first = train(out, ["wandb"], stop_at=6, run_name="exp1", wandb_api_key=None)
    wb = tracker(first, WandbTracker)
    assert wb.mode == "offline"
    run_id = wb.run_id
    (dir1,) = glob.glob(str(out / "wandb" / "offline-run-*"))
    recs = records(dir1)  # read at once: fit() returned, so the file is complete (its last record is the exit)
    assert recs[-1]["type"] == "exit" and recs[-1]["exit"].get("exit_code", 0) == 0
    (run,) = of_type(recs, "run")
    assert run["run_id"] == run_id and run["display_name"] == "exp1" and run["project"] == "paddle-trainer"
    config = run["config"]["update"]
    assert config["learning_rate"] == 0.05 and config["max_steps"] == 8 and "wandb_api_key" not in config
    assert history(recs, "train/loss") == pytest.approx(logged(first, "loss"), rel=1e-6)
    assert history(recs, "eval/loss") == pytest.approx(logged(first, "eval_loss"), rel=1e-6)
    summary = {}
    for s in of_type(recs, "summary"):
        summary.update(s.get("update", {}))
    assert summary["eval_loss"] == pytest.approx(first.state.metrics["eval_loss"]) and summary["status"] == "stopped"
    assert any("model-" + run_id in json.dumps(a) for a in of_type(recs, "artifact"))

    second = train(out, ["wandb"], resume="auto", run_name="exp1")  # from step 6 to 8
    assert tracker(second, WandbTracker).run_id == run_id
    write_results(second)
    dirs = sorted(set(glob.glob(str(out / "wandb" / "offline-run-*"))) - {dir1})
    assert len(dirs) == 2  # the resumed fit(), then results.json: both the same W&B run
    resumed, results = records(dirs[0]), records(dirs[1])
    assert [r["run_id"] for r in of_type(resumed, "run") + of_type(results, "run")] == [run_id, run_id]
    assert history(resumed, "train/loss") == pytest.approx({8: logged(second, "loss")[8]}, rel=1e-6)
    assert resumed[-1]["type"] == "exit" and results[-1]["type"] == "exit"
    assert any("results-json-" + run_id in json.dumps(a) for a in of_type(results, "artifact"))


def test_mode_is_offline_without_a_key(no_key, monkeypatch):
    assert wandb_mode(None) == "offline"
    assert wandb_mode("0123456789abcdef") == "online"  # wandb_api_key acts
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode("0123456789abcdef") == "disabled"  # the user's WANDB_MODE wins
