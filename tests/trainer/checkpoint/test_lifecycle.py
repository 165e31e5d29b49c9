"""The checkpoint lifecycle as a user meets it (issue 19, items 1 and 2): real ``ptrain run digits`` runs,
a real damaged file (one byte flipped), a checkpoint of another run copied in."""

import os
import shutil
import subprocess
import sys

from helpers import REPO


def ptrain(*args, cwd, timeout=240):
    return subprocess.run([sys.executable, "-m", "trainer.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=dict(os.environ, PYTHONPATH=REPO))


def run_digits(cwd, out, *flags):
    done = ptrain("run", "digits", "--output_dir", out, "--disable_tqdm", "true", "--evaluation_strategy", "no",
                  "--save_strategy", "steps", *flags, cwd=cwd)
    return done


def flip_a_byte(path):
    with open(path, "r+b") as f:
        f.seek(-3, 2)
        byte = f.read(1)
        f.seek(-3, 2)
        f.write(bytes([byte[0] ^ 0xFF]))


def steps(root):
    return sorted(n for n in os.listdir(root) if n.startswith("step-"))


def test_damaged_newest_is_set_aside_and_rotation_keeps_the_progress(tmp_path):
    first = run_digits(tmp_path, "run", "--max_steps", "20", "--save_steps", "10")
    assert first.returncode == 0, first.stderr
    root = tmp_path / "run" / "checkpoints"
    flip_a_byte(root / "step-20" / "model.safetensors")
    again = run_digits(tmp_path, "run", "--max_steps", "15", "--save_steps", "5", "--save_total_limit", "1",
                       "--resume_from_checkpoint", "auto")
    assert again.returncode == 0, again.stderr
    assert "set aside damaged checkpoint step-20 as step-20.damaged" in again.stderr, again.stderr
    assert "resuming from" in again.stderr and "step-10" in again.stderr
    # the new step-15 is the newest verified one; the damaged one is kept aside, never counted or deleted
    assert steps(root) == ["step-15", "step-20.damaged"]
    assert (root / "latest").read_text().strip() == "step-15"
    listing = ptrain("inspect", str(tmp_path / "run"), cwd=tmp_path)
    assert listing.returncode == 0 and "resume 'auto' would take: step-15" in listing.stdout, listing.stdout


def test_rotation_counts_in_the_order_saved_after_an_explicit_earlier_resume(tmp_path):
    first = run_digits(tmp_path, "run", "--max_steps", "20", "--save_steps", "10")
    assert first.returncode == 0, first.stderr
    root = tmp_path / "run" / "checkpoints"
    again = run_digits(tmp_path, "run", "--max_steps", "15", "--save_steps", "5", "--save_total_limit", "1",
                       "--resume_from_checkpoint", str(root / "step-10"))
    assert again.returncode == 0, again.stderr
    assert steps(root) == ["step-15"]  # the abandoned step-20 is older than the step-15 saved after it
    assert (root / "latest").read_text().strip() == "step-15"


def test_auto_resumes_only_this_runs_checkpoints(tmp_path):
    mine = run_digits(tmp_path, "mine", "--max_steps", "20", "--save_steps", "10")
    other = run_digits(tmp_path, "other", "--max_steps", "30", "--save_steps", "30")
    assert mine.returncode == 0 and other.returncode == 0, mine.stderr + other.stderr
    root = tmp_path / "mine" / "checkpoints"
    os.remove(root / "step-20" / "manifest.json")
    shutil.copytree(tmp_path / "other" / "checkpoints" / "step-30", root / "step-30")
    again = run_digits(tmp_path, "mine", "--max_steps", "25", "--save_steps", "25", "--resume_from_checkpoint", "auto")
    assert again.returncode == 0, again.stderr
    assert "resuming from" in again.stderr and f"{os.sep}step-10 " in again.stderr, again.stderr
    assert "not resuming 1 checkpoint(s) of another run" in again.stderr and "step-30" in again.stderr
    assert steps(root) == ["step-10", "step-20.damaged", "step-25", "step-30"]  # the foreign one is untouched
