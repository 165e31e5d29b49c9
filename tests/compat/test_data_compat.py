"""Data and metrics as PaddleNLP scripts give them: mapping batches (paddlenlp's
BatchEncoding) as keyword arguments with and without DataLoader workers, a
DataLoader given as a dataset, nested and bad compute_metrics results, metric
names with or without ``eval_``, load_best_model_at_end, remove_unused_columns,
tuple-like outputs."""

import os
import sys

import numpy as np
import paddle
import pytest
from helpers import ToyDataset, make_mlp
from patience import patience

from trainer import ConfigError, DataError, Trainer, TrainingArguments
from trainer.compat.outputs import EvalPrediction, PredictionOutput, TrainOutput

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def args_for(tmp_path, **kw):
    values = dict(output_dir=str(tmp_path), per_device_train_batch_size=16, per_device_eval_batch_size=16,
                  num_train_epochs=1, learning_rate=0.01, report_to=[], save_strategy="no", device="cpu")
    values.update(kw)
    return TrainingArguments(**values)


def test_batchencoding_batches_reach_the_model_as_keywords(tmp_path, workers=0):
    pytest.importorskip("paddlenlp")
    from compat_helpers import make_tiny_ernie
    from paddlenlp.data import DataCollatorWithPadding
    from paddlenlp.transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = make_tiny_ernie(str(tmp_path / "ernie"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_classes=2)
    samples = [dict(tokenizer("好的天" * (1 + i % 3)), labels=i % 2) for i in range(32)]
    collate = DataCollatorWithPadding(tokenizer)
    assert not isinstance(collate(samples[:2]), dict)  # a BatchEncoding: a Mapping, not a dict
    trainer = Trainer(model, args_for(tmp_path / "out", dataloader_num_workers=workers, evaluation_strategy="no"),  # workers: below
                      train_dataset=samples, eval_dataset=samples, collate_fn=collate)
    trainer.fit()
    assert trainer.state.global_step == 2
    assert np.isfinite(trainer.evaluate()["eval_loss"])


MAPPING_WITH_WORKERS = """
import collections, sys
import paddle
sys.path.insert(0, {repo!r}); sys.path.insert(0, {tests!r})
from helpers import ToyDataset, make_mlp
from trainer import Trainer, TrainingArguments

class Batch(collections.abc.Mapping):  # a Mapping that is not a dict, like paddlenlp's BatchEncoding
    def __init__(self, data): self.data = data
    def __getitem__(self, key): return self.data[key]
    def __iter__(self): return iter(self.data)
    def __len__(self): return len(self.data)

def collate(samples):
    return Batch({{"features": paddle.io.dataloader.collate.default_collate_fn([s[0] for s in samples]),
                  "labels": paddle.io.dataloader.collate.default_collate_fn([s[1] for s in samples])}})

class Net(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.net = make_mlp()
    def forward(self, features, labels=None):
        logits = self.net(features)
        return paddle.nn.functional.cross_entropy(logits, labels.reshape([-1, 1])), logits

for workers in (0, 1):
    args = TrainingArguments(output_dir={out!r} + str(workers), per_device_train_batch_size=16, max_steps=3,
                             dataloader_num_workers=workers, report_to=[], save_strategy="no",
                             evaluation_strategy="no", device="cpu")
    trainer = Trainer(Net(), args, train_dataset=ToyDataset(64), collate_fn=collate)
    trainer.fit()
    print("ok", workers, trainer.state.global_step)
"""


def test_mapping_batches_are_keywords_with_and_without_workers(tmp_path):
    """In a fresh process: forking DataLoader workers from a test process that has run many trainers is not safe."""
    import subprocess

    from helpers import REPO

    code = MAPPING_WITH_WORKERS.format(repo=REPO, tests=os.path.join(REPO, "tests"), out=str(tmp_path / "out"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=patience(300), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ok 0 3" in proc.stdout and "ok 1 3" in proc.stdout


def test_a_dataloader_given_as_dataset_gets_one_clear_line(tmp_path):
    loader = paddle.io.DataLoader(ToyDataset(32), batch_size=8)
    trainer = Trainer(make_mlp(), args_for(tmp_path), train_dataset=loader, loss_fn=paddle.nn.CrossEntropyLoss())
    with pytest.raises(DataError, match=r"the training dataset is a paddle.io.DataLoader: pass its dataset \(loader.dataset\)"):
        trainer.fit()


def test_nested_compute_metrics_are_flattened_and_bad_values_named(tmp_path):
    def nested(p):
        return {"f1": {"macro": 0.5, "micro": np.float32(0.75)}, "acc": np.array(1.0)}

    trainer = Trainer(make_mlp(), args_for(tmp_path), eval_dataset=ToyDataset(32), loss_fn=paddle.nn.CrossEntropyLoss(),
                      compute_metrics=nested)
    metrics = trainer.evaluate()
    assert metrics["eval_f1_macro"] == 0.5 and metrics["eval_f1_micro"] == 0.75 and metrics["eval_acc"] == 1.0
    trainer.compute_metrics = lambda p: {"report": {"text": "all good"}}
    with pytest.raises(ConfigError, match=r"compute_metrics returned str for 'report_text', not a number"):
        trainer.evaluate()


def accuracy(p):
    return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids.reshape(-1)).mean())}


def test_metric_for_best_model_without_eval_prefix_finds_the_best_checkpoint(tmp_path):
    args = args_for(tmp_path, num_train_epochs=2, evaluation_strategy="epoch", save_strategy="epoch",
                    metric_for_best_model="accuracy", save_total_limit=1)
    trainer = Trainer(make_mlp(), args, train_dataset=ToyDataset(64), eval_dataset=ToyDataset(32, seed=1),
                      loss_fn=paddle.nn.CrossEntropyLoss(), compute_metrics=accuracy)
    trainer.fit()
    assert trainer.state.best_checkpoint is not None and os.path.isdir(trainer.state.best_checkpoint)
    assert trainer.state.best_metric is not None


def test_a_metric_no_evaluation_produces_is_an_error_listing_the_keys(tmp_path):
    args = args_for(tmp_path, evaluation_strategy="epoch", metric_for_best_model="bleu")
    trainer = Trainer(make_mlp(), args, train_dataset=ToyDataset(32), eval_dataset=ToyDataset(32, seed=1),
                      loss_fn=paddle.nn.CrossEntropyLoss(), compute_metrics=accuracy)
    with pytest.raises(ConfigError, match=r"metric_for_best_model 'bleu' is not in the evaluation metrics "
                                          r"\(eval_accuracy, eval_loss, eval_samples\)"):
        trainer.fit()


def test_load_best_model_at_end_puts_the_best_weights_in_the_model(tmp_path):
    from safetensors.numpy import load_file

    scores = iter([3.0, 1.0, 2.0])  # the first evaluation is the best

    def score(p):
        return {"score": next(scores)}

    args = args_for(tmp_path, num_train_epochs=3, evaluation_strategy="epoch", save_strategy="epoch",
                    metric_for_best_model="score", greater_is_better=True, load_best_model_at_end=True,
                    save_total_limit=1)
    trainer = Trainer(make_mlp(), args, train_dataset=ToyDataset(64), eval_dataset=ToyDataset(32, seed=1),
                      loss_fn=paddle.nn.CrossEntropyLoss(), compute_metrics=score)
    trainer.fit()
    assert os.path.basename(trainer.state.best_checkpoint) == "step-4"
    best = load_file(os.path.join(trainer.state.best_checkpoint, "model.safetensors"))
    for name, value in trainer.model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), best[name])
    out = trainer.save_model(str(tmp_path / "final"))
    saved = paddle.load(os.path.join(out, "model_state.pdparams"))
    np.testing.assert_array_equal(saved["0.weight"].numpy(), best["0.weight"])


def test_load_best_model_at_end_needs_saves_at_evaluations():
    with pytest.raises(ConfigError, match="load_best_model_at_end needs a checkpoint at every evaluation"):
        TrainingArguments(load_best_model_at_end=True, evaluation_strategy="epoch", save_strategy="steps")
    assert TrainingArguments(load_best_model_at_end=True, save_strategy="epoch").metric_for_best_model == "loss"


class KeywordModel(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.net = make_mlp()

    def forward(self, features, labels=None):
        logits = self.net(features)
        return logits if labels is None else (paddle.nn.functional.cross_entropy(logits, labels.reshape([-1, 1])), logits)


class RawColumns(paddle.io.Dataset):
    """Samples with a raw text column the model does not take."""

    def __init__(self, n=32):
        self.data = ToyDataset(n)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        x, y = self.data[i]
        return {"features": x, "labels": y, "sentence": f"sample {i}"}


def test_remove_unused_columns_drops_what_forward_does_not_take(tmp_path):
    trainer = Trainer(KeywordModel(), args_for(tmp_path, evaluation_strategy="no"), train_dataset=RawColumns(),
                      eval_dataset=RawColumns())
    trainer.fit()
    assert np.isfinite(trainer.evaluate()["eval_loss"])
    keep = Trainer(KeywordModel(), args_for(tmp_path / "b", remove_unused_columns=False, evaluation_strategy="no"),
                   train_dataset=RawColumns())
    with pytest.raises(Exception):
        keep.fit()


def test_outputs_unpack_like_tuples(tmp_path):
    trainer = Trainer(make_mlp(), args_for(tmp_path), train_dataset=ToyDataset(32), loss_fn=paddle.nn.CrossEntropyLoss(),
                      compute_metrics=accuracy)
    preds, labels, metrics = trainer.predict(ToyDataset(16))
    assert isinstance(trainer.predict(ToyDataset(16)), PredictionOutput)
    assert preds.shape == (16, 2) and labels.shape[0] == 16 and "test_accuracy" in metrics
    p, l = EvalPrediction(preds, labels)
    assert p is preds and l is labels
    step, loss, train_metrics = trainer.train()
    assert isinstance(TrainOutput(step, loss, train_metrics), tuple) and step == 2 and np.isfinite(loss)
    assert {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss"} <= set(train_metrics)


class TwoLabelModel(paddle.nn.Layer):
    """A QA-style model: two label keys, the model computes the loss when given them."""

    def __init__(self):
        super().__init__()
        self.net = make_mlp(classes=4)

    def forward(self, features, start_positions=None, end_positions=None):
        logits = self.net(features)
        if start_positions is None:
            return logits
        ce = paddle.nn.functional.cross_entropy
        return (ce(logits[:, :2], start_positions.reshape([-1, 1])) + ce(logits[:, 2:], end_positions.reshape([-1, 1])), logits)


class TwoLabels(RawColumns):
    def __getitem__(self, i):
        x, y = self.data[i]
        return {"features": x, "start_positions": y, "end_positions": 1 - y}


def test_several_label_names_reach_compute_metrics_as_a_tuple(tmp_path):
    seen = {}

    def metrics(p):
        seen["labels"] = p.label_ids
        return {"n": len(p.label_ids)}

    trainer = Trainer(TwoLabelModel(), args_for(tmp_path, label_names=["start_positions", "end_positions"],
                                                evaluation_strategy="no"),
                      train_dataset=TwoLabels(), eval_dataset=TwoLabels(), compute_metrics=metrics)
    trainer.fit()
    out = trainer.evaluate()
    starts, ends = seen["labels"]
    assert out["eval_n"] == 2 and starts.shape[0] == 32 and (starts.reshape(-1) + ends.reshape(-1) == 1).all()
