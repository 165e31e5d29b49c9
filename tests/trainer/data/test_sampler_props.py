"""Property tests (hypothesis) of the sampler position arithmetic.

For any dataset length, batch size, world size, drop_last, seed, epoch and
start position:

- across ranks, an epoch holds every sample exactly once, plus the documented
  padding (the first ``total_size - n`` samples of the padded list repeated, so
  every rank gets ``ceil(n / world_size)`` samples), minus, with drop_last, each
  rank's last incomplete batch;
- every rank yields the same number of batches (collectives cannot deadlock),
  and that number is ``len(sampler)``;
- a sampler started at batch ``s`` yields exactly the tail ``[s:]`` of the full
  epoch, at a cost that does not depend on ``s`` (it is computed, not replayed);
- the batches are those of ``paddle.io.DistributedBatchSampler`` (data_seed 0);
- the evaluation sampler covers each index exactly once, in dataset order.
"""

import collections
import itertools
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paddle.io import DistributedBatchSampler

from trainer.data import InterleavedEvalSampler, ResumableDistributedBatchSampler, ShardedEvalSampler

SETTINGS = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

dataset_lengths = st.integers(min_value=1, max_value=300)
batch_sizes = st.integers(min_value=1, max_value=40)
world_sizes = st.integers(min_value=1, max_value=8)


def epoch_batches(n, batch, world, rank, drop_last, seed, epoch, start=0, shuffle=True):
    sampler = ResumableDistributedBatchSampler(n, batch, num_replicas=world, rank=rank, shuffle=shuffle,
                                               seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch, start_batch=start)
    batches = list(sampler)
    return sampler, batches


def padded_counts(n, world):
    """How often each sample appears in one epoch across ranks (drop_last=False): once, plus padding."""
    total = math.ceil(n / world) * world
    padded = list(range(n))
    padded += (padded * math.ceil((total - n) / n))[:total - n]
    return collections.Counter(padded)


@SETTINGS
@given(n=dataset_lengths, batch=batch_sizes, world=world_sizes, seed=st.integers(0, 2**16),
       epoch=st.integers(0, 1000), shuffle=st.booleans())
def test_an_epoch_covers_every_sample_once_plus_padding(n, batch, world, seed, epoch, shuffle):
    seen = collections.Counter()
    lengths = set()
    for rank in range(world):
        sampler, batches = epoch_batches(n, batch, world, rank, False, seed, epoch, shuffle=shuffle)
        lengths.add(len(batches))
        assert len(sampler) == len(batches) == sampler.batches_per_epoch()
        assert all(len(b) == batch for b in batches[:-1]) and 0 < len(batches[-1]) <= batch
        assert sum(map(len, batches)) == math.ceil(n / world)
        seen.update(itertools.chain.from_iterable(batches))
    assert len(lengths) == 1, f"ranks yield different numbers of batches: {lengths}"
    assert seen == padded_counts(n, world)
    assert set(seen) == set(range(n))
    assert sum(seen.values()) - n < world  # fewer padding duplicates than processes


@SETTINGS
@given(n=dataset_lengths, batch=batch_sizes, world=world_sizes, seed=st.integers(0, 2**16), epoch=st.integers(0, 50))
def test_drop_last_drops_only_each_ranks_incomplete_batch(n, batch, world, seed, epoch):
    per_rank = math.ceil(n / world)
    kept, lengths = collections.Counter(), set()
    for rank in range(world):
        sampler, full = epoch_batches(n, batch, world, rank, False, seed, epoch)
        _, dropped = epoch_batches(n, batch, world, rank, True, seed, epoch)
        assert len(dropped) == len(sampler.__class__(n, batch, world, rank, drop_last=True)) == per_rank // batch
        assert all(len(b) == batch for b in dropped)
        assert dropped == full[:per_rank // batch]  # the same order, the incomplete tail cut
        lengths.add(len(dropped))
        kept.update(itertools.chain.from_iterable(dropped))
    assert len(lengths) == 1
    allowed = padded_counts(n, world)
    assert all(kept[i] <= allowed[i] for i in kept)
    assert sum(kept.values()) == world * (per_rank // batch) * batch


@SETTINGS
@given(n=dataset_lengths, batch=batch_sizes, world=world_sizes, drop_last=st.booleans(),
       seed=st.integers(0, 2**16), epoch=st.integers(0, 1000), data=st.data())
def test_a_resumed_epoch_is_the_tail_of_the_full_epoch(n, batch, world, drop_last, seed, epoch, data):
    rank = data.draw(st.integers(0, world - 1), label="rank")
    _, full = epoch_batches(n, batch, world, rank, drop_last, seed, epoch)
    start = data.draw(st.integers(0, len(full) + 2), label="start_batch")
    resumed, tail = epoch_batches(n, batch, world, rank, drop_last, seed, epoch, start=start)
    assert tail == full[start:]
    assert len(resumed) == len(tail)


@SETTINGS
@given(n=dataset_lengths, batch=batch_sizes, world=world_sizes, drop_last=st.booleans(),
       seed=st.integers(0, 2**16), epoch=st.integers(0, 1000), accumulation=st.integers(1, 6), data=st.data())
def test_resuming_at_an_optimizer_step_continues_the_sample_stream(n, batch, world, drop_last, seed, epoch,
                                                                   accumulation, data):
    """The trainer resumes at ``step_in_epoch * gradient_accumulation_steps`` batches: the micro-batches
    of the remaining optimizer steps are exactly those the uninterrupted run would have used."""
    rank = data.draw(st.integers(0, world - 1), label="rank")
    _, full = epoch_batches(n, batch, world, rank, drop_last, seed, epoch)
    steps_per_epoch = math.ceil(len(full) / accumulation)
    step = data.draw(st.integers(0, steps_per_epoch), label="step_in_epoch")
    _, rest = epoch_batches(n, batch, world, rank, drop_last, seed, epoch, start=step * accumulation)
    remaining_steps = [full[i:i + accumulation] for i in range(step * accumulation, len(full), accumulation)]
    assert [rest[i:i + accumulation] for i in range(0, len(rest), accumulation)] == remaining_steps


@SETTINGS
@given(n=dataset_lengths, batch=batch_sizes, world=world_sizes, drop_last=st.booleans(), epoch=st.integers(0, 100))
def test_same_batches_as_paddle_distributed_batch_sampler(n, batch, world, drop_last, epoch):
    data = list(range(n))
    for rank in range(world):
        theirs = DistributedBatchSampler(data, batch_size=batch, num_replicas=world, rank=rank, shuffle=True,
                                         drop_last=drop_last)
        theirs.set_epoch(epoch)
        _, ours = epoch_batches(n, batch, world, rank, drop_last, 0, epoch)
        assert ours == list(theirs)


@SETTINGS
@given(n=dataset_lengths, batch=batch_sizes, seed=st.integers(0, 2**16), epoch=st.integers(0, 1000))
def test_one_process_epochs_are_permutations_of_the_dataset(n, batch, seed, epoch):
    _, batches = epoch_batches(n, batch, 1, 0, False, seed, epoch)
    assert sorted(itertools.chain.from_iterable(batches)) == list(range(n))
    _, again = epoch_batches(n, batch, 1, 0, False, seed, epoch)
    assert again == batches  # a pure function of (seed, epoch)


def test_resume_position_is_computed_not_replayed():
    """Starting at batch 10 or at batch 20,000 of a 1,280,000-sample epoch draws the same
    single permutation: no batch before the start is ever produced."""
    import time

    def first_batch_time(start):
        sampler = ResumableDistributedBatchSampler(1_280_000, 64, num_replicas=2, rank=1, seed=3)
        sampler.set_epoch(5, start_batch=start)
        t = time.perf_counter()
        first = next(iter(sampler))
        return time.perf_counter() - t, first

    early, _ = first_batch_time(10)
    late, batch = first_batch_time(9_999)
    assert len(batch) == 64
    assert late < 3 * early + 0.05, (early, late)


@SETTINGS
@given(n=st.integers(1, 500), batch=batch_sizes, world=world_sizes)
def test_eval_sampler_covers_each_index_once_in_order(n, batch, world):
    if n < world:  # the trainer refuses fewer samples than processes
        world = n
    got, sizes = [], []
    for rank in range(world):
        sampler = ShardedEvalSampler(n, batch, world, rank)
        batches = list(sampler)
        assert len(sampler) == len(batches)
        assert all(0 < len(b) <= batch for b in batches)
        sizes.append(sum(map(len, batches)))
        got += list(itertools.chain.from_iterable(batches))
    assert got == list(range(n))
    assert max(sizes) - min(sizes) <= 1


@SETTINGS
@given(n=dataset_lengths, batch=batch_sizes, world=world_sizes)
def test_interleaved_eval_shards_read_every_sample_once_and_their_gathered_order_restores_the_dataset(n, batch, world):
    """PaddleFormers' evaluation order (rank r reads r, r + world, ...): every sample once, none padded in, and the
    outputs gathered in rank order put back by ``gathered_order``."""
    gathered = []
    for rank in range(world):
        sampler = InterleavedEvalSampler(n, batch, world, rank)
        batches = list(sampler)
        assert len(sampler) == len(batches) and all(0 < len(b) <= batch for b in batches)
        assert all(i % world == rank for b in batches for i in b)
        gathered += list(itertools.chain.from_iterable(batches))
    order = InterleavedEvalSampler(n, batch, world, 0).gathered_order()
    assert list(order) == gathered and sorted(gathered) == list(range(n))
    rows = np.asarray(gathered) * 10  # an output row made from its sample
    restored = np.empty_like(rows)
    restored[order] = rows
    assert list(restored) == [i * 10 for i in range(n)]
