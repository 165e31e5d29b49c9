"""``ptrain run TASK --help`` lists the task's own options. Before: only the generic flags (a ResNet user could
not find --depth or --data_dir without reading the source). After: a group "task options (TASK)" with every
option of the task's options class, its meaning (the comment beside the field) and its default."""

import contextlib
import io

import pytest

from trainer.cli import commands
from trainer.cli.tasks import get_task


@pytest.mark.parametrize("name", ["resnet", "digits", "ernie"])
def test_run_task_help_lists_every_task_option(name):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        commands.main(["run", name, "--help"])
    assert done.value.code == 0
    text = out.getvalue()
    task = get_task(name)
    assert f"task options ({task.name}" in text
    for option, _, default, meaning in task.option_help():
        assert f"--{option}" in text, option
    if name == "resnet":
        assert "--depth INT" in text and "18 | 34 | 50 | 101 | 152 (default: 50)" in text


def test_run_help_without_a_task_is_the_generic_one():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        commands.main(["run", "--help"])
    assert "task options" not in out.getvalue()
