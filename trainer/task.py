"""Tasks: what ``ptrain run NAME`` trains. A task turns validated options and
``TrainingArguments`` into a :class:`TaskRun` (model, datasets, loss, metrics).

Tasks register through the ``ptrain.tasks`` entry-point group (see setup.cfg),
so ``trainer`` never imports ``models`` and any installed package can add one::

    [options.entry_points]
    ptrain.tasks =
        my_task = my_package.task:TASK

Recipes are YAML files in the task's ``recipes_dir``::

    description: one line
    task: {option: value}        # the task's own options (its options_class)
    args: {field: value}         # TrainingArguments
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Dict, List, Optional

from .errors import ConfigError

ENTRY_POINT_GROUP = "ptrain.tasks"


@dataclass
class TaskRun:
    """What a task hands to the Trainer."""

    model: Any
    train_dataset: Any = None
    eval_dataset: Any = None
    test_dataset: Any = None
    loss_fn: Optional[Callable] = None
    collate_fn: Optional[Callable] = None
    compute_metrics: Optional[Callable] = None
    callbacks: List[Any] = field(default_factory=list)
    info: Dict[str, Any] = field(default_factory=dict)   # printed by --dry_run and saved in results.json


@dataclass
class Task:
    name: str
    description: str
    options_class: type                                   # a dataclass that validates in __post_init__
    build: Callable[[Any, Any], TaskRun]                  # build(options, args) -> TaskRun
    recipes_dir: str
    default_recipe: str = "demo"
    # predict(model_dir, inputs) -> one dict per input (e.g. {"input": ..., "label": ..., "score": ...});
    # ``ptrain predict TASK --model DIR INPUT...`` calls it on an exported inference model
    predict: Optional[Callable[[str, List[str]], List[dict]]] = None

    def recipes(self) -> List[str]:
        if not os.path.isdir(self.recipes_dir):
            return []
        return sorted(f[:-5] for f in os.listdir(self.recipes_dir) if f.endswith(".yaml"))

    def recipe_path(self, recipe: str) -> str:
        if os.path.isfile(recipe):
            return recipe
        path = os.path.join(self.recipes_dir, f"{recipe}.yaml")
        if not os.path.isfile(path):
            known = ", ".join(self.recipes()) or "none"
            raise ConfigError(f"unknown recipe '{recipe}' for task {self.name}: known recipes are {known} (or give a YAML path)")
        return path

    def option_names(self) -> List[str]:
        return [f.name for f in dataclasses.fields(self.options_class)]


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
