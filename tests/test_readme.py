"""The README stays true: its example runs, its tables match the code, CI runs its test command."""

import os
import re
import subprocess
import sys

from helpers import REPO

README = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()


def _block_after(heading):
    section = README.split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_subclass_and_callback_example_runs(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_block_after("## Subclass the Trainer and add a callback"))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=REPO), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step 50: loss" in out.stdout and "step 150: loss" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "stopped 150"
    assert "PrintLoss" in out.stdout  # describe_callbacks() lists it


def test_event_table_matches_the_code():
    from trainer.events import event_table_markdown

    assert event_table_markdown() in README


def test_ci_runs_the_readme_test_command():
    test_command = re.search(r"Run the test suite.*?```bash\n(.*?)\n```", README, re.S).group(1).strip()
    with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    assert test_command.replace("pip install", "python -m pip install") in ci


def test_every_default_callback_is_in_the_readme_table():
    from callbacks.defaults import default_callbacks
    from trainer import TrainingArguments

    args = TrainingArguments(amp="bf16", warmup_steps=1)
    for cb in default_callbacks(args):
        assert f"| `{type(cb).__name__}` |" in README, type(cb).__name__
