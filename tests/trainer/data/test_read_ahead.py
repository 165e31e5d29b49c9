"""Batches read ahead in a thread (dataloader_read_ahead, with 0 workers): the same training as
building each batch in the training thread, the dataset's error at its step, and exact resume whether the
dataset draws randomness from the first batch, only later, or never."""

import random
import threading

import numpy as np
import paddle
import pytest
from helpers import StopAt, ToyDataset, make_mlp, params_of

from callbacks import Callback
from trainer import Trainer, TrainingArguments
from trainer.data.read_ahead import ReadAhead, host_rng_state
from trainer.errors import DataError


class Recording(ToyDataset):
    """ToyDataset that records which thread fetched each sample; the samples in ``draws`` (all with
    ``draws="all"``) add python and numpy noise to their features (a dataset that draws only for some)."""

    def __init__(self, n=96, draws=(), fail_at=None):
        super().__init__(n)
        self.draws, self.fail_at = draws, fail_at
        self.threads = []

    def __getitem__(self, i):
        self.threads.append(threading.current_thread().name)
        if i == self.fail_at:
            raise ValueError(f"sample {i} is broken")
        x, y = super().__getitem__(i)
        if self.draws == "all" or i in self.draws:
            x = x + np.float32(random.random()) + np.random.rand(len(x)).astype("float32")
        return x, y


class Steps(Callback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, trainer):
        self.steps.append(trainer.state.global_step)


def fit(tmp_path, data, read_ahead=True, trainer_cls=Trainer, stop_at=None, **overrides):
    values = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=20, logging_steps=5,
                  report_to=[], save_strategy="no", dataloader_read_ahead=read_ahead, seed=3)
    values.update(overrides)
    steps = Steps()
    trainer = trainer_cls(make_mlp(), TrainingArguments(**values), train_dataset=data,
                          loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[steps] + ([StopAt(stop_at)] if stop_at else []))
    state = trainer.fit()
    return trainer, state, steps


def assert_same_params(a, b):
    pa, pb = params_of(a.model), params_of(b.model)
    assert pa.keys() == pb.keys()
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k])


def read_ahead_threads():
    return [t for t in threading.enumerate() if t.name == "ptrain-read-ahead"]


def test_read_ahead_trains_exactly_what_the_training_thread_trains(tmp_path):
    ahead_data, here_data = Recording(), Recording()
    ahead, state, _ = fit(tmp_path / "ahead", ahead_data)
    here, _, _ = fit(tmp_path / "here", here_data, read_ahead=False)
    assert state.status == "completed" and state.global_step == 20
    assert_same_params(ahead, here)
    assert "ptrain-read-ahead" in ahead_data.threads  # the thread did read batches
    assert set(here_data.threads) == {"MainThread"}
    # the first batch of each epoch is fetched in the training thread, to check it draws nothing
    assert ahead_data.threads[:8] == ["MainThread"] * 8
    assert read_ahead_threads() == []  # fit() ended them


def test_a_dataset_that_draws_is_read_in_the_training_thread(tmp_path):
    data = Recording(draws="all")
    ahead, _, _ = fit(tmp_path / "ahead", data)
    here, _, _ = fit(tmp_path / "here", Recording(draws="all"), read_ahead=False)
    assert set(data.threads) == {"MainThread"}
    assert_same_params(ahead, here)


def later_draws(tmp_path):
    """The samples of batches 3-11 of the first epoch that are not in the second epoch's first batch:
    the first batch of each epoch draws nothing (the check passes), batch 3 is the first that draws."""
    first, second = data_order(tmp_path, 0), data_order(tmp_path, 1)
    return set(first[3 * 8:]) - set(second[:8])


def test_a_dataset_that_draws_later_resumes_exactly(tmp_path):
    draws = later_draws(tmp_path)
    data = Recording(draws=draws)
    full, _, _ = fit(tmp_path / "full", data, max_steps=24)
    inline, _, _ = fit(tmp_path / "inline", Recording(draws=draws), read_ahead=False, max_steps=24)
    assert_same_params(full, inline)  # the draws are the training thread's, in the same order
    # batches 1-3 read by the thread (3 is the first that draws: it stops there), the rest of the epoch here
    assert set(data.threads[8:32]) == {"ptrain-read-ahead"} and set(data.threads[32:96]) == {"MainThread"}
    for stop in (2, 3, 5, 13):  # saves before, at and after the first draw, and in the second epoch
        out = tmp_path / f"stop{stop}"
        fit(out, Recording(draws=draws), max_steps=24, stop_at=stop, save_strategy="steps", save_steps=stop)
        resumed, state, _ = fit(out, Recording(draws=draws), max_steps=24, resume_from_checkpoint="auto")
        assert state.global_step == 24
        assert_same_params(resumed, full)


def test_the_datasets_error_is_raised_at_its_step(tmp_path):
    fail_at = data_order(tmp_path, 0)[4 * 8 + 3]  # a sample of the 5th batch
    steps = Steps()
    broken = Recording(fail_at=fail_at)
    args = TrainingArguments(output_dir=str(tmp_path / "broken"), per_device_train_batch_size=8, max_steps=20,
                             report_to=[], save_strategy="no", seed=3, dataloader_read_ahead=True)
    trainer = Trainer(make_mlp(), args, train_dataset=broken, loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[steps])
    with pytest.raises(DataError, match=f"sample {fail_at} cannot be loaded \\(ValueError: sample {fail_at} is broken\\)"):
        trainer.fit()
    assert steps.steps == [1, 2, 3, 4]  # the four steps before it ran, and no later one
    assert "ptrain-read-ahead" in broken.threads
    assert read_ahead_threads() == []


def data_order(tmp_path, epoch):
    """The sample order of an epoch of :func:`fit`'s runs (its sampler, data_seed and world)."""
    from trainer.data import ResumableDistributedBatchSampler

    seed = TrainingArguments(output_dir=str(tmp_path), seed=3).data_seed
    sampler = ResumableDistributedBatchSampler(96, 8, num_replicas=1, rank=0, shuffle=True, seed=seed, drop_last=False)
    sampler.set_epoch(epoch)
    return [int(i) for batch in sampler for i in batch]


class DrawingStep(Trainer):
    def compute_loss(self, model, batch, return_outputs=False):
        np.random.rand()  # the training thread draws from numpy's global RNG every step
        return super().compute_loss(model, batch, return_outputs=return_outputs)


def test_a_training_step_that_draws_turns_read_ahead_off(tmp_path):
    data = Recording()
    ahead, _, _ = fit(tmp_path / "ahead", data, trainer_cls=DrawingStep, max_steps=12)
    here, _, _ = fit(tmp_path / "here", Recording(), trainer_cls=DrawingStep, read_ahead=False, max_steps=12)
    assert_same_params(ahead, here)
    assert data.threads[-8:] == ["MainThread"] * 8  # seen within the first steps: the rest is read here
    assert data.threads.count("ptrain-read-ahead") <= 3 * 8  # at most the batches read before it was seen


def test_settle_undoes_a_batch_that_drew_and_fetches_it_again():
    def fetch(indices):
        return [i + (random.random() if i >= 4 else 0.0) for i in indices]

    batches = [[0, 1], [2, 3], [4, 5], [6, 7]]
    random.seed(7)
    expected = [fetch(b) for b in batches]
    random.seed(7)
    it = ReadAhead(iter(batches), fetch, lambda b: b)
    got = [next(it), next(it)]  # the first here (checked), the second by the thread, which goes on to [4, 5]
    for _ in range(500):  # until the thread has fetched [4, 5], drawn, and stopped
        if it._ch.ready and it._ch.ready[-1].drew_from is not None:
            break
        threading.Event().wait(0.01)
    else:
        raise AssertionError("the thread did not fetch the batch that draws")
    it.settle()
    undone = host_rng_state()
    random.seed(7)
    assert host_rng_state() == undone  # the RNG is where [4, 5] had not been fetched: seed 7, no draw yet
    got += [next(it), next(it)]  # [4, 5] again, here, and [6, 7] here: it draws
    assert got == expected and it.inline and read_ahead_threads() == []
    it.close()


def test_rng_fingerprints_see_every_kind_of_draw():
    for draw in (random.random, lambda: random.getrandbits(32 * 624), lambda: random.gauss(0, 1),
                 np.random.rand, lambda: np.random.randint(0, 10, size=624)):
        before = host_rng_state()
        draw()
        assert host_rng_state() != before
    before = host_rng_state()
    assert host_rng_state() == before


def test_an_iterator_dropped_half_way_ends_its_thread():
    it = ReadAhead(iter([[i] for i in range(100)]), lambda b: b, lambda b: b)
    assert next(it) == [0] and next(it) == [1] and len(read_ahead_threads()) == 1
    del it  # e.g. a loop over the loader that broke out, or raised, before its end
    for _ in range(500):
        if not read_ahead_threads():
            break
        threading.Event().wait(0.01)
    assert read_ahead_threads() == []
