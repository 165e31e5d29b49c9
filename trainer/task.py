"""The task interface: what ``ptrain run NAME`` trains. A task turns validated options and
``TrainingArguments`` into a :class:`TaskRun` (model, datasets, loss, metrics). Tasks
(``models.*``) depend on this module and the loop, never on the commands.

Tasks register through the ``ptrain.tasks`` entry-point group (see setup.cfg),
so ``trainer`` never imports ``models`` (``trainer.cli.tasks`` finds them) and any installed package can add one::

    [options.entry_points]
    ptrain.tasks =
        my_task = my_package.task:TASK

``ptrain run NAME --dry_run`` prints the resolved arguments, the model's size and the callbacks
without training. A task may give ``dry_build(options, args) -> TaskRun``: the model and ``info``
without the datasets (no data loaded, no dataset library imported), which the dry run calls
instead of ``build``; a task without it is built whole for a dry run.

Recipes are YAML files in the task's ``recipes_dir``::

    description: one line
    task: {option: value}        # the task's own options (its options_class)
    args: {field: value}         # TrainingArguments
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .errors import ConfigError

#: option names that choose the train / eval / test split: never allowed to change on resume
SPLIT_OPTIONS = ("split_seed", "dev_fraction", "val_fraction", "test_fraction")

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
class Preprocessing:
    """How ``ptrain serve`` answers a task's raw inputs (``{"images": [...]}``, ``{"texts": [...]}``).

    ``encode(items)`` -> the model's inputs for those items (arrays in the
    model's input order, or a dict of arrays by input name), raising ``ValueError`` (``DataError``) with one line
    naming the item on a bad one; ``decode(outputs, items)`` -> one dict per
    item, as ``ptrain predict`` prints them. ``encode`` and ``decode`` run in the
    server's threads, so they must not hold the model (the predictor processes do).
    """

    field: str                                            # the request's field: "images" or "texts"
    description: str                                      # what an item is, for the 400 line
    encode: Callable[[List[Any]], List[Any]]
    decode: Callable[[List[Any], List[Any]], List[dict]]
    # sizes(items) -> (width, height) of each image, read from its header without decoding (ValueError naming a
    # bad item): the server refuses an image over --max_image_pixels (413) and bounds the pixels decoded at once
    sizes: Optional[Callable[[List[Any]], List[Tuple[int, int]]]] = None


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
    # preprocessing(model_dir) -> Preprocessing: what ``ptrain serve`` needs for the task's raw inputs; the
    # export directory names the task (``task.json`` / ``preprocess.json``: {"task": NAME})
    preprocessing: Optional[Callable[[str], Preprocessing]] = None
    # dry_build(options, args) -> TaskRun without datasets: what ``ptrain run NAME --dry_run`` builds
    # (the model, info and callbacks; no data loaded). None: the dry run calls build()
    dry_build: Optional[Callable[[Any, Any], TaskRun]] = None
    # options a resume may change, each with the reason (docs/how-to/resume.md); every other option is compared
    # with the checkpoint's and a change is refused. An option of the split is never allowed (SPLIT_OPTIONS).
    resume_may_change: Dict[str, str] = field(default_factory=dict)
    # the names ``ptrain serve`` gives the exported model's outputs (``logits``), in the export's order
    output_names: Optional[Sequence[str]] = None

    def __post_init__(self):
        split = sorted(set(self.resume_may_change) & set(SPLIT_OPTIONS))
        if split:
            raise ConfigError(f"task {self.name}: resume_may_change lists {split}, options of the split, which a "
                              "resume may never change (test samples would leak into training)")

    def run_identity(self, options) -> dict:
        """What a checkpoint of this task's run records besides TrainingArguments (``Trainer.run_identity``):
        the task and every option; a resume compares them (``trainer.checkpoint.resume.check_identity``)."""
        fields = {"task": self.name, **dataclasses.asdict(options)}
        return {"source": f"task {self.name}", "fields": fields, "may_change": dict(self.resume_may_change),
                "split": [name for name in SPLIT_OPTIONS if name in fields]}

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
