"""IterableDataset: trains with max_steps (passes wrap around), evaluates, and
resumes exactly: through the dataset's own state_dict/load_state_dict when it
has them, else by skipping the consumed batches (with a warning)."""

import logging

import numpy as np
import paddle
import pytest
from helpers import ToyDataset, make_mlp, params_of

from trainer import DataError, Trainer, TrainingArguments


class Stream(paddle.io.IterableDataset):
    """40 samples; a new pass starts where the last one ended."""

    def __init__(self, n=40):
        self.data = ToyDataset(n)
        self.pos = 0

    def __iter__(self):
        while self.pos < len(self.data):
            i = self.pos
            self.pos += 1
            yield self.data[i]
        self.pos = 0


class StatefulStream(Stream):
    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


def fit(tmp_path, dataset, max_steps, resume=None, **kw):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=max_steps,
                             learning_rate=0.05, lr_scheduler_type="constant", save_steps=4, report_to=[],
                             evaluation_strategy="no", device="cpu", **kw)
    trainer = Trainer(make_mlp(), args, train_dataset=dataset, loss_fn=paddle.nn.CrossEntropyLoss())
    trainer.fit(resume_from_checkpoint=resume)
    return trainer


@pytest.mark.parametrize("cls", [StatefulStream, Stream])
def test_resume_is_exact(tmp_path, cls, caplog):
    whole = fit(tmp_path / "whole", cls(), max_steps=8)  # 5 batches a pass: the stream wraps around
    fit(tmp_path / "split", cls(), max_steps=6)
    with caplog.at_level(logging.WARNING, logger="trainer"):
        resumed = fit(tmp_path / "split", cls(), max_steps=8, resume="auto")
    assert resumed.state.global_step == 8
    skipped = any("skipping the" in r.getMessage() for r in caplog.records)
    assert skipped == (cls is Stream)  # only without state_dict/load_state_dict
    for name, value in params_of(whole.model).items():
        np.testing.assert_allclose(params_of(resumed.model)[name], value, rtol=1e-6, atol=1e-7)


def test_a_stream_needs_max_steps(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], device="cpu")
    trainer = Trainer(make_mlp(), args, train_dataset=Stream(), loss_fn=paddle.nn.CrossEntropyLoss())
    with pytest.raises(DataError, match="IterableDataset, which has no length: set max_steps"):
        trainer.fit()


def test_a_stream_evaluates_and_predicts(tmp_path):
    trainer = fit(tmp_path, Stream(), max_steps=2)
    metrics = trainer.evaluate(Stream(20))
    assert metrics["eval_samples"] == 20 and np.isfinite(metrics["eval_loss"])
    assert trainer.predict(Stream(12)).predictions.shape == (12, 2)


def test_a_stateful_stream_brings_its_state_callback_and_a_later_fit_without_one_drops_it(tmp_path):
    """The trainer adds callbacks.iterable_dataset_state for a stream with state_dict/load_state_dict (the data
    room defines no callback); a second fit() on a stream without them leaves none behind."""
    from callbacks.iterable_dataset_state import IterableDatasetState

    trainer = fit(tmp_path, StatefulStream(), max_steps=2)
    carried = [cb for cb in trainer.callbacks if isinstance(cb, IterableDatasetState)]
    assert len(carried) == 1 and carried[0].batches.dataset is trainer.train_dataset
    trainer.train_dataset = Stream()
    trainer.fit()
    assert trainer.callbacks.get(IterableDatasetState) is None
