"""A user's own ``callbacks.py`` beside the script shadows the ``callbacks`` package. Before:
``ModuleNotFoundError: No module named 'callbacks.base'; 'callbacks' is not a package`` from deep
inside the trainer. After: ``import trainer`` says which file hides which package, and the fix."""

import os
import subprocess
import sys

from helpers import REPO


def _run(folder):
    (folder / "train.py").write_text("from trainer import Trainer\nprint('imported')\n")
    return subprocess.run([sys.executable, "train.py"], cwd=folder, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=REPO))


def test_a_callbacks_py_beside_the_script_is_named_with_the_fix(tmp_path):
    (tmp_path / "callbacks.py").write_text("class MyCallback: pass\n")
    done = _run(tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"trainer.errors.ConfigError: {tmp_path / 'callbacks.py'} shadows paddle-trainer's 'callbacks' "
                    "package (Python looks in the script's folder first): rename your callbacks.py (e.g. "
                    "my_callbacks.py) and its imports"), done.stderr
    assert "is not a package" not in done.stderr


def test_a_callbacks_folder_of_ones_own_too(tmp_path):
    (tmp_path / "callbacks").mkdir()
    (tmp_path / "callbacks" / "__init__.py").write_text("")
    done = _run(tmp_path)
    assert done.returncode != 0 and "shadows paddle-trainer's 'callbacks' package" in done.stderr


def test_without_a_shadow_nothing_is_said(tmp_path):
    (tmp_path / "my_callbacks.py").write_text("class MyCallback: pass\n")
    done = _run(tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "imported", done.stderr
