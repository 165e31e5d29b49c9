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


class HuberTrainer(Trainer):
    """A regression trainer whose loss is Huber's, set only by overriding compute_loss."""

    def compute_loss(self, model, batch, return_outputs=False):
        x, y = batch
        outputs = model(x)
        loss = paddle.nn.functional.smooth_l1_loss(outputs, y, delta=1.0)
        return (loss, outputs) if return_outputs else loss


class Regression(paddle.io.Dataset):
    def __init__(self, n=24):
        rng = np.random.RandomState(3)
        self.x = rng.randn(n, 8).astype("float32")
        self.y = (3.0 * rng.randn(n, 2)).astype("float32")  # large targets: Huber and MSE differ a lot

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def test_eval_loss_is_the_overridden_compute_loss_not_loss_fn(tmp_path):
    data = Regression()
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=24, report_to=[])
    model = make_mlp(seed=1)
    # loss_fn (MSE) is what a Trainer without the override would use; the override must win in evaluation too
    trainer = HuberTrainer(model, args, eval_dataset=data, loss_fn=paddle.nn.MSELoss())
    metrics = trainer.evaluate()
    out = model(paddle.to_tensor(data.x))
    huber = float(paddle.nn.functional.smooth_l1_loss(out, paddle.to_tensor(data.y), delta=1.0))
    mse = float(paddle.nn.functional.mse_loss(out, paddle.to_tensor(data.y)))
    assert abs(metrics["eval_loss"] - huber) < 1e-5 and abs(huber - mse) > 1.0
    np.testing.assert_allclose(trainer.predict(data).predictions, out.numpy(), rtol=1e-5, atol=1e-6)


def test_an_override_without_return_outputs_still_sets_eval_loss(tmp_path):
    class TwoArgs(Trainer):
        def compute_loss(self, model, batch):
            return paddle.nn.functional.smooth_l1_loss(model(batch[0]), batch[1])

    data = Regression()
    model = make_mlp(seed=1)
    trainer = TwoArgs(model, TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=24, report_to=[]),
                      eval_dataset=data)
    out = model(paddle.to_tensor(data.x))
    huber = float(paddle.nn.functional.smooth_l1_loss(out, paddle.to_tensor(data.y)))
    assert abs(trainer.evaluate()["eval_loss"] - huber) < 1e-5


def test_fit_reports_its_speed_under_the_names_train_uses(tmp_path):
    """fit()'s state.train_metrics: train_runtime and speeds (PaddleNLP's train() reports the same dict)."""
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=4, report_to=[],
                             evaluation_strategy="no", save_strategy="no")
    trainer = Trainer(make_mlp(), args, train_dataset=ToyDataset(32), loss_fn=paddle.nn.CrossEntropyLoss())
    m = trainer.fit().train_metrics
    assert set(m) == {"train_runtime", "train_samples_per_second", "train_steps_per_second"}
    assert m["train_runtime"] > 0 and m["train_samples_per_second"] > m["train_steps_per_second"] > 0
    assert "train_metrics" not in trainer.state.state_dict()  # this fit()'s, not saved in checkpoints
