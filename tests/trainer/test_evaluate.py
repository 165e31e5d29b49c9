"""evaluate() and predict(): every sample once, in order, metrics over the whole set."""

import numpy as np
import paddle
from helpers import ToyDataset, make_mlp

from trainer import Trainer, TrainingArguments


def accuracy(pred):
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


def test_uneven_eval_set_matches_direct_computation(tmp_path):
    model = make_mlp(seed=5)
    data = ToyDataset(37, seed=9)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=8, report_to=[])
    trainer = Trainer(model, args, eval_dataset=data, loss_fn=paddle.nn.CrossEntropyLoss(), compute_metrics=accuracy)
    metrics = trainer.evaluate()
    logits = model(paddle.to_tensor(data.x))
    loss = float(paddle.nn.functional.cross_entropy(logits, paddle.to_tensor(data.y)))
    acc = float((logits.numpy().argmax(-1) == data.y).mean())
    assert metrics["eval_samples"] == 37
    assert abs(metrics["eval_loss"] - loss) < 1e-6
    assert metrics["eval_accuracy"] == acc
    out = trainer.predict(data)
    np.testing.assert_allclose(out.predictions, logits.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out.label_ids, data.y)
    assert out.metrics["test_accuracy"] == acc


def test_evaluate_restores_training_mode_and_needs_no_grad(tmp_path):
    model = make_mlp()
    model.train()
    trainer = Trainer(model, TrainingArguments(output_dir=str(tmp_path), report_to=[]),
                      eval_dataset=ToyDataset(10), loss_fn=paddle.nn.CrossEntropyLoss())
    trainer.evaluate()
    assert model.training
    assert all(p.grad is None for p in model.parameters())
