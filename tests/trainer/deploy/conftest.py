"""The models the server tests serve: a trained digits MLP (exported by Trainer.export()) and a slower random MLP."""

import numpy as np
import paddle
import pytest
from paddle.static import InputSpec

from trainer import Trainer, TrainingArguments
from trainer.deploy.export import export_model


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    """A digits MLP trained 30 steps, exported by Trainer.export() (export.json and all)."""
    from models.digits.data import load_splits
    from models.digits.task import build_mlp

    out = tmp_path_factory.mktemp("digits")
    paddle.seed(0)
    train, val, _ = load_splits(seed=0)
    model = build_mlp(64, 10, 32, 2, 0.0)
    args = TrainingArguments(output_dir=str(out), max_steps=30, per_device_train_batch_size=32, report_to=[],
                             save_strategy="no", evaluation_strategy="no", logging_steps=10)
    trainer = Trainer(model, args, train_dataset=train, eval_dataset=val, loss_fn=paddle.nn.CrossEntropyLoss())
    trainer.fit()
    path = trainer.export()
    return path, np.stack([val[i][0] for i in range(16)]).astype("float32")


@pytest.fixture(scope="module")
def slow_dir(tmp_path_factory):
    """A random 64 -> 2048 x 3 -> 10 MLP (8.5 M parameters): a few ms per call on one core."""
    paddle.seed(1)
    layers, width = [], 64
    for _ in range(3):
        layers += [paddle.nn.Linear(width, 2048), paddle.nn.ReLU()]
        width = 2048
    model = paddle.nn.Sequential(*layers, paddle.nn.Linear(width, 10))
    path = str(tmp_path_factory.mktemp("slow") / "inference")
    export_model(model, path, input_spec=[InputSpec([None, 64], "float32", "x")])
    return path


