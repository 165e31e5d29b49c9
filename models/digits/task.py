"""The digits task: options, model and metrics, registered as ``ptrain run digits``."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import paddle

from callbacks.export import Export
from trainer.errors import ConfigError
from trainer.task import Task, TaskRun

from .data import load_splits
from .predict import predict


@dataclass
class DigitsOptions:
    hidden_size: int = 64
    num_layers: int = 2
    dropout: float = 0.0
    split_seed: int = 0

    def __post_init__(self):
        if int(self.hidden_size) <= 0:
            raise ConfigError(f"hidden_size={self.hidden_size!r} is not allowed: hidden_size must be an integer > 0")
        if int(self.num_layers) < 1:
            raise ConfigError(f"num_layers={self.num_layers!r} is not allowed: num_layers must be an integer >= 1")
        if not 0 <= float(self.dropout) < 1:
            raise ConfigError(f"dropout={self.dropout!r} is not allowed: dropout must be a number in [0, 1)")
        self.hidden_size, self.num_layers = int(self.hidden_size), int(self.num_layers)
        self.dropout, self.split_seed = float(self.dropout), int(self.split_seed)


def build_mlp(in_features: int, num_classes: int, hidden_size: int, num_layers: int, dropout: float) -> paddle.nn.Layer:
    layers, width = [], in_features
    for _ in range(num_layers - 1):
        layers += [paddle.nn.Linear(width, hidden_size), paddle.nn.ReLU()]
        if dropout:
            layers.append(paddle.nn.Dropout(dropout))
        width = hidden_size
    layers.append(paddle.nn.Linear(width, num_classes))
    return paddle.nn.Sequential(*layers)


def accuracy(pred) -> dict:
    return {"accuracy": float((np.asarray(pred.predictions).argmax(-1) == np.asarray(pred.label_ids)).mean())}


def build(options: DigitsOptions, args) -> TaskRun:
    run = dry_build(options, args)
    train, val, test = load_splits(seed=options.split_seed)  # scikit-learn loads here, not for a dry run
    run.train_dataset, run.eval_dataset, run.test_dataset = train, val, test
    run.info = {"train_samples": len(train), "eval_samples": len(val), "test_samples": len(test), **run.info}
    return run


class DigitsExport(Export):
    """``callbacks.Export``, then ``task.json`` (``{"task": "digits"}``) next to the inference model, so that
    ``ptrain serve`` names the model ``digits`` and its output ``logits``.

    Events: ``on_fit_end`` (main process, completed or stopped runs). State: none.
    """

    def on_fit_end(self, trainer):
        super().on_fit_end(trainer)
        if self.result is not None:
            with open(os.path.join(self.result.path, "task.json"), "w", encoding="utf-8") as f:
                json.dump({"task": "digits"}, f)


def dry_build(options: DigitsOptions, args) -> TaskRun:
    """The run without its data (``ptrain run digits --dry_run``): model, loss, metrics, info."""
    paddle.seed(args.seed)  # the model's initial weights follow the run's seed
    model = build_mlp(64, 10, options.hidden_size, options.num_layers, options.dropout)
    return TaskRun(model=model, loss_fn=paddle.nn.CrossEntropyLoss(), compute_metrics=accuracy,
                   callbacks=[DigitsExport()],  # output_dir/inference: what ptrain serve serves
                   info={"parameters": int(sum(int(np.prod(p.shape)) for p in model.parameters()))})


TASK = Task(
    name="digits",
    description="MLP on scikit-learn's 8x8 digits (embedded data; trains in seconds on a CPU)",
    options_class=DigitsOptions,
    build=build,
    recipes_dir=os.path.join(os.path.dirname(__file__), "recipes"),
    dry_build=dry_build,
    predict=predict,
    output_names=("logits",),
)
