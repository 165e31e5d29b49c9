"""A dataset that builds its own batches (``__getitems__`` returning an ``AssembledBatch``): one call per
sampler batch with and without DataLoader workers, its batch handed on as it is, per-batch seeding."""

import random

import numpy as np
import paddle
import pytest

from trainer.data import ResumableDistributedBatchSampler, SeededDataset, close_iterator, make_loader
from trainer.data.batch import AssembledBatch, default_collate


class Assembling(paddle.io.Dataset):
    """Row i of a batch is filled with i plus a draw of numpy's RNG (the random augmentation of a real one)."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return np.full(6, i, "float32") + np.random.randint(0, 1000), np.int64(i % 3)

    def __getitems__(self, indices):
        images = np.empty((len(indices), 6), "float32")
        labels = np.empty(len(indices), "int64")
        for k, i in enumerate(indices):
            images[k], labels[k] = self[i]
        images[:, -1] = -1.0  # marks a batch that was built here, not stacked by a collate function
        return AssembledBatch([(images[k], labels[k]) for k in range(len(indices))], [images, labels])


def batches(dataset, workers, seed=0, epoch=0, collate_fn=None):
    sampler = ResumableDistributedBatchSampler(len(dataset), 4, shuffle=True, seed=seed, drop_last=True)
    sampler.set_epoch(epoch)
    source = SeededDataset(dataset, seed) if workers else dataset
    if workers:
        source.set_epoch(epoch)
    it = iter(make_loader(source, sampler, collate_fn, workers))
    try:
        return [[np.asarray(t) for t in batch] for batch in it], [sampler.batch_indices(b) for b in range(len(sampler))]
    finally:
        close_iterator(it)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_each_batch_is_built_by_the_dataset_and_handed_on_as_it_is(workers):
    np.random.seed(0)
    got, indices = batches(Assembling(), workers)
    assert len(got) == 6
    for (images, labels), idx in zip(got, indices):
        assert images.shape == (4, 6) and (images[:, -1] == -1).all()  # one __getitems__ call per batch
        assert (images[:, 0] - np.asarray(idx) >= 0).all() and list(labels) == [i % 3 for i in idx]


@pytest.mark.timeout(120)
def test_with_workers_a_batch_is_seeded_from_the_epoch_and_its_first_index():
    """Which worker builds a batch does not matter, nor where the run started: the same draws each time."""
    first, _ = batches(Assembling(), 2, epoch=1)
    np.random.seed(123)
    random.seed(123)
    second, _ = batches(Assembling(), 2, epoch=1)
    other_epoch, _ = batches(Assembling(), 2, epoch=2)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(first, second))
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(first, other_epoch))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_collate_fn_of_your_own_gets_the_samples(workers):
    seen = []

    def collate(samples):
        seen.append(type(samples).__name__)
        assert isinstance(samples, list) and len(samples) == 4
        return default_collate([(x * 0 + 7, y) for x, y in samples])  # a plain list: stacked as usual

    got, _ = batches(Assembling(), workers, collate_fn=collate)
    assert all((images == 7).all() for images, _ in got)
    if workers == 0:
        assert seen == ["AssembledBatch"] * 6
