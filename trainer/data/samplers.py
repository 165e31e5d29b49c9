"""Batch samplers.

``ResumableDistributedBatchSampler`` yields the very batches of paddle's
``DistributedBatchSampler`` (same padding, same per-epoch permutation
``RandomState(seed + epoch)``, same interleaving of ranks), and can start in the
middle of an epoch by computing its position (``set_epoch(epoch, start_batch)``)
instead of replaying batches.

The epoch's length is fixed for the run: it is the dataset's length when the
run was planned (the steps per epoch, ``max_steps`` from ``num_train_epochs``,
the learning-rate schedule, and the sample index a resume computes all come
from it, and every rank computes the same permutation from it without talking
to the others). :meth:`~ResumableDistributedBatchSampler.length_changed` re-reads
it at each epoch's start: a dataset that grew is named in one warning and the
run goes on over the samples it planned; one that shrank stops with a DataError
before any of the missing samples is asked for.

``ShardedEvalSampler`` splits evaluation data into contiguous, unpadded shards
so that no sample is counted twice and none is dropped; gathering the shards in
rank order restores the dataset order. ``InterleavedEvalSampler`` deals samples
to the ranks in turn (rank ``r`` reads ``r, r + k, ...``), PaddleFormers' order
for evaluation, so its batches (and a batch-mean ``eval_loss``) are the same; its
``gathered_order()`` says where each gathered sample comes from, so the gathered
outputs are put back in dataset order.
"""

from __future__ import annotations

import math
from typing import Iterator, List, Optional

import numpy as np
from paddle.io import BatchSampler

from ..errors import DataError


class ResumableDistributedBatchSampler(BatchSampler):
    """Per-rank batches of a shuffled (or ordered) epoch.

    Args:
        dataset_len: number of samples.
        batch_size: samples per rank per batch.
        num_replicas, rank: world size and this process's rank.
        shuffle: permute each epoch with ``numpy.random.RandomState(seed + epoch)``.
        seed: added to the epoch; 0 reproduces ``paddle.io.DistributedBatchSampler``.
        drop_last: drop the last incomplete batch.
    """

    def __init__(self, dataset_len: int, batch_size: int, num_replicas: int = 1, rank: int = 0,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False):
        self.dataset_len = dataset_len
        self.batch_size = batch_size
        self.nranks = num_replicas
        self.local_rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.start_batch = 0
        self.num_samples = int(math.ceil(dataset_len / num_replicas))
        self.total_size = self.num_samples * num_replicas
        self._told = dataset_len  # the last length named in a warning

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Select the epoch; skip its first ``start_batch`` batches (resume)."""
        self.epoch = epoch
        self.start_batch = start_batch

    def length_changed(self, n: int, epoch: int) -> Optional[str]:
        """Check the dataset's length ``n``, read again at the start of ``epoch``, against the planned one.
        Shrunk: DataError (one line). Grown: the warning to give, once per new length (the run keeps the planned
        samples); else None."""
        planned = self.dataset_len
        if n < planned:
            raise DataError(f"the training dataset has {n} samples at the start of epoch {epoch}, {planned} when this "
                            f"run was planned: samples {n}-{planned - 1} of its epochs are gone (the steps per epoch, "
                            f"the learning-rate schedule and resume positions are computed from {planned}); put the "
                            f"data back and resume, or start a fresh run over the {n} samples")
        if n == planned or n == self._told:
            return None
        self._told = n
        return (f"the training dataset has {n} samples at the start of epoch {epoch}, {planned} when this run was "
                f"planned: the run goes on over the first {planned} (samples {planned}-{n - 1} are not read: the steps "
                f"per epoch, the learning-rate schedule and resume positions are computed from {planned}, and every "
                f"rank must draw the same order); to train on all {n}, start a fresh run over them")

    def _global_indices(self) -> np.ndarray:
        # numpy arrays: RandomState.shuffle draws the same permutation as on a list, ~7x faster
        indices = np.arange(self.dataset_len, dtype=np.int64)
        padding = self.total_size - self.dataset_len
        if padding:  # repeat the first samples, cyclically, as paddle's DistributedBatchSampler does
            indices = np.concatenate([indices, np.resize(indices, padding)])
        if self.shuffle:
            np.random.RandomState(self.seed + self.epoch).shuffle(indices)
        return indices

    def _local_indices(self) -> np.ndarray:
        indices = self._global_indices()
        if self.nranks == 1:
            return indices
        # the ranks take turns, batch_size samples each; the tail is split evenly
        stride = self.batch_size * self.nranks
        tail = self.total_size % stride
        body = indices[:len(indices) - tail].reshape(-1, self.nranks, self.batch_size)[:, self.local_rank, :]
        tail_per_rank = tail // self.nranks
        rest = indices[len(indices) - tail:][self.local_rank * tail_per_rank:(self.local_rank + 1) * tail_per_rank]
        return np.concatenate([body.reshape(-1), rest])

    def __iter__(self) -> Iterator[List[int]]:
        local = self._local_indices()
        start = self.start_batch * self.batch_size
        for i in range(start, len(local), self.batch_size):
            batch = local[i:i + self.batch_size]
            if len(batch) < self.batch_size and self.drop_last:
                return
            yield batch.tolist()

    def __len__(self) -> int:
        full = self.num_samples // self.batch_size
        total = full if self.drop_last else int(math.ceil(self.num_samples / self.batch_size))
        return max(0, total - self.start_batch)

    def batch_indices(self, batch: int) -> List[int]:
        """The dataset indices of this rank's batch number ``batch`` of the current epoch (for error messages)."""
        return self._local_indices()[batch * self.batch_size:(batch + 1) * self.batch_size].tolist()

    def batches_per_epoch(self) -> int:
        full = self.num_samples // self.batch_size
        return full if self.drop_last else int(math.ceil(self.num_samples / self.batch_size))


class ShardedEvalSampler(BatchSampler):
    """Contiguous, unpadded shard ``rank`` of ``num_replicas``, in batches."""

    def __init__(self, dataset_len: int, batch_size: int, num_replicas: int = 1, rank: int = 0):
        self.batch_size = batch_size
        base, extra = divmod(dataset_len, num_replicas)
        self.start = rank * base + min(rank, extra)
        self.stop = self.start + base + (1 if rank < extra else 0)

    def __iter__(self) -> Iterator[List[int]]:
        for i in range(self.start, self.stop, self.batch_size):
            yield list(range(i, min(i + self.batch_size, self.stop)))

    def __len__(self) -> int:
        return int(math.ceil((self.stop - self.start) / self.batch_size))


class InterleavedEvalSampler(BatchSampler):
    """Rank ``rank`` of ``num_replicas`` reads samples ``rank, rank + num_replicas, ...``, in batches: PaddleFormers'
    evaluation order on several processes (its ``MappingDistributedBatchSampler`` without shuffling), every sample
    read once (PaddleFormers leaves out the last ``len % num_replicas``; here they are read too)."""

    def __init__(self, dataset_len: int, batch_size: int, num_replicas: int = 1, rank: int = 0):
        self.batch_size, self.dataset_len, self.num_replicas = batch_size, dataset_len, num_replicas
        self.indices = list(range(rank, dataset_len, num_replicas))

    def __iter__(self) -> Iterator[List[int]]:
        for i in range(0, len(self.indices), self.batch_size):
            yield self.indices[i:i + self.batch_size]

    def __len__(self) -> int:
        return int(math.ceil(len(self.indices) / self.batch_size))

    def gathered_order(self) -> np.ndarray:
        """The dataset index of each sample of the ranks' outputs gathered in rank order."""
        return np.concatenate([np.arange(r, self.dataset_len, self.num_replicas) for r in range(self.num_replicas)])
