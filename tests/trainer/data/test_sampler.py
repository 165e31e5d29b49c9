"""The resumable sampler yields paddle's DistributedBatchSampler batches, and resumes by position."""

import itertools

import pytest
from helpers import ToyDataset
from paddle.io import DistributedBatchSampler

from trainer.data import ResumableDistributedBatchSampler, ShardedEvalSampler


@pytest.mark.parametrize("n,batch,nranks,drop_last", [(100, 32, 1, False), (97, 8, 2, False), (97, 8, 3, True),
                                                       (10, 4, 4, False), (64, 16, 2, True)])
def test_same_batches_as_paddle_distributed_batch_sampler(n, batch, nranks, drop_last):
    data = ToyDataset(n)
    for rank in range(nranks):
        theirs = DistributedBatchSampler(data, batch_size=batch, num_replicas=nranks, rank=rank, shuffle=True,
                                         drop_last=drop_last)
        ours = ResumableDistributedBatchSampler(n, batch, num_replicas=nranks, rank=rank, shuffle=True,
                                                drop_last=drop_last)
        for epoch in range(3):
            theirs.set_epoch(epoch)
            ours.set_epoch(epoch)
            assert list(ours) == list(theirs), (rank, epoch)
            assert len(ours) == len(theirs)


def test_resume_mid_epoch_computes_the_position():
    full = ResumableDistributedBatchSampler(50, 4, num_replicas=2, rank=1, shuffle=True, seed=7)
    full.set_epoch(3)
    expected = list(full)[5:]
    resumed = ResumableDistributedBatchSampler(50, 4, num_replicas=2, rank=1, shuffle=True, seed=7)
    resumed.set_epoch(3, start_batch=5)
    assert list(resumed) == expected and len(resumed) == len(expected)


def test_data_seed_changes_the_order():
    a = ResumableDistributedBatchSampler(50, 5, seed=0)
    b = ResumableDistributedBatchSampler(50, 5, seed=1)
    assert list(a) != list(b)


@pytest.mark.parametrize("n,nranks", [(37, 2), (37, 3), (5, 4), (8, 8)])
def test_eval_shards_cover_each_sample_once_in_order(n, nranks):
    got = []
    for rank in range(nranks):
        got += list(itertools.chain.from_iterable(ShardedEvalSampler(n, 4, nranks, rank)))
    assert got == list(range(n))
