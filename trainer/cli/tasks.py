"""The task registry: the installed tasks, found through the ``ptrain.tasks`` entry-point group.

An entry point may name the extra its task needs (``ernie = models.ernie.task:TASK [paddlenlp]``): where that
extra's packages are not installed (a PaddleFormers environment has no paddlenlp), the task is refused in one
line naming them and the install command, before anything is built or launched; ``ptrain list`` still lists it.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import Any, Dict, List

from ..errors import ConfigError, pip_extra
from ..task import Task

ENTRY_POINT_GROUP = "ptrain.tasks"


def available_tasks() -> Dict[str, Any]:
    """name -> entry point, for every installed task."""
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def get_task(name: str, usable: bool = True) -> Task:
    """The task ``name``; with ``usable`` (running, predicting, serving it), refused when its extra is missing."""
    tasks = available_tasks()
    if name not in tasks:
        import difflib

        close = difflib.get_close_matches(name, list(tasks), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        known = ", ".join(sorted(tasks)) or "none (is the package installed with pip install -e .?)"
        raise ConfigError(f"unknown task '{name}'{hint}: known tasks are {known}")
    if usable:
        problem = missing_extra(tasks[name])
        if problem:
            raise ConfigError(f"task {name} {problem}")
    task = tasks[name].load()
    if not isinstance(task, Task):
        raise ConfigError(f"entry point {name} does not name a trainer.task.Task")
    return task


def missing_extra(ep) -> str:
    """What the entry point's extras need and this environment lacks, as the rest of one line with the install
    command; '' when nothing is missing. Only names are checked: the extra's pins are the tested versions, and
    an environment with other versions of them is the user's to keep."""
    if not ep.extras or ep.dist is None:
        return ""
    for extra in ep.extras:
        missing = [name for name in _extra_requirements(ep.dist, extra) if not _installed(name)]
        if missing:
            where = pip_extra(extra)
            if "paddlenlp" in missing and _installed("paddleformers"):
                where = ("paddlenlp cannot share an environment with paddleformers; in one of its own: "
                         + pip_extra("cpu"))
            return f"needs {', '.join(missing)} (the {extra} extra), not installed here: {where}"
    return ""


def _extra_requirements(dist, extra: str) -> List[str]:
    """The distribution names the extra ``extra`` of ``dist`` requires (from its ``Requires-Dist`` lines)."""
    marker = re.compile(r"""extra\s*==\s*["']{}["']""".format(re.escape(extra)))
    names = []
    for requirement in dist.requires or []:
        if ";" in requirement and marker.search(requirement.split(";", 1)[1]):
            names.append(re.match(r"[A-Za-z0-9._-]+", requirement.strip()).group(0))
    return names


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True
