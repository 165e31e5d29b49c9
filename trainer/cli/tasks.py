"""The task registry: the installed tasks, found through the ``ptrain.tasks`` entry-point group."""

from __future__ import annotations

from importlib import metadata
from typing import Any, Dict

from ..errors import ConfigError
from ..task import Task

ENTRY_POINT_GROUP = "ptrain.tasks"


def available_tasks() -> Dict[str, Any]:
    """name -> entry point, for every installed task."""
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def get_task(name: str) -> Task:
    tasks = available_tasks()
    if name not in tasks:
        import difflib

        close = difflib.get_close_matches(name, list(tasks), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        known = ", ".join(sorted(tasks)) or "none (is the package installed with pip install -e .?)"
        raise ConfigError(f"unknown task '{name}'{hint}: known tasks are {known}")
    task = tasks[name].load()
    if not isinstance(task, Task):
        raise ConfigError(f"entry point {name} does not name a trainer.task.Task")
    return task
