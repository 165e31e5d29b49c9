"""Token-id datasets, per-batch padding and length bucketing for the ERNIE task.

* :class:`TokenDataset` holds one int32 id array per text (already ``[CLS] ...
  [SEP]`` and truncated) and its label.
* :func:`collate` pads a batch to its longest sequence (not to ``max_seq_len``)
  and returns the dict batch paddlenlp models take:
  ``input_ids``, ``token_type_ids`` and ``labels``.
* :class:`LengthBucketing` (a callback, ``bucket_batches: true``) makes batches
  of similar lengths without replacing the Trainer's sampler.

Why bucketing works through the dataset: the Trainer owns the sampler (a
``ResumableDistributedBatchSampler``: which samples each rank gets in each
epoch, and a resume position that is a batch count). On every epoch begin the
callback recomputes, with the sampler's own public class and the run's
arguments, the list of dataset indices this rank will read; it cuts that list
into chunks of ``bucket_chunk`` batches, sorts each chunk by length, cuts the
sorted chunk into batches, shuffles those batches, and gives the dataset a
permutation so that position ``p`` of the stream serves the sample sorted into
place ``p``. Each rank therefore reads exactly the samples the sampler gave it,
each once per epoch; only the order inside a chunk changes. The permutation is
a pure function of (seed, epoch, rank), so an exact resume stays exact. A
cleaner seam would be a Trainer hook for the batch sampler (see the task's
README notes); this works with the Trainer as it is.

    >>> import numpy as np
    >>> ds = TokenDataset([np.array([1, 7, 2]), np.array([1, 2])], [1, 0])
    >>> batch = collate([ds[0], ds[1]], as_tensors=False)
    >>> batch["input_ids"].tolist(), batch["labels"].tolist()
    ([[1, 7, 2], [1, 2, 0]], [1, 0])
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import paddle

from callbacks.base import Callback
from trainer.data import ResumableDistributedBatchSampler

PAD_ID = 0


class TokenDataset(paddle.io.Dataset):
    """``(ids, label)`` items; ``set_order`` remaps positions (bucketing)."""

    def __init__(self, ids: Sequence[np.ndarray], labels: Sequence[int]):
        if len(ids) != len(labels):
            raise ValueError(f"{len(ids)} id arrays but {len(labels)} labels")
        self.ids = list(ids)
        self.labels = np.asarray(labels, dtype="int64")
        self.lengths = np.fromiter((len(x) for x in self.ids), dtype="int64", count=len(self.ids))
        self.order: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        j = int(self.order[i]) if self.order is not None else i
        return self.ids[j], self.labels[j]

    def set_order(self, order: Optional[np.ndarray]) -> None:
        """Position ``i`` serves sample ``order[i]`` (``None``: the identity)."""
        self.order = order

    def sorted_by_length(self) -> "TokenDataset":
        """A copy in length order (for evaluation: batches pad little; metrics ignore order)."""
        idx = np.argsort(self.lengths, kind="stable")
        return TokenDataset([self.ids[i] for i in idx], self.labels[idx])


def collate(items, as_tensors: bool = True, length: Optional[int] = None) -> dict:
    """Pad ``(ids, label)`` items to the longest in the batch (pad id 0), or to ``length`` (pipeline parallel:
    every micro-batch of a step has one shape, see ``trainer.parallel.pipeline``)."""
    longest = max(len(ids) for ids, _ in items) if length is None else int(length)
    input_ids = np.full((len(items), longest), PAD_ID, dtype="int64")
    for row, (ids, _) in enumerate(items):
        input_ids[row, :len(ids)] = ids
    labels = np.asarray([label for _, label in items], dtype="int64")
    batch = {"input_ids": input_ids, "token_type_ids": np.zeros_like(input_ids), "labels": labels}
    return {k: paddle.to_tensor(v) for k, v in batch.items()} if as_tensors else batch


def bucketed_order(local: Sequence[int], lengths: np.ndarray, batch_size: int, chunk_batches: int,
                   rng: np.random.RandomState, order: Optional[np.ndarray] = None) -> np.ndarray:
    """A permutation ``order`` of the dataset such that reading ``order[local[p]]`` for
    p = 0, 1, ... yields the same samples as ``local`` in length-bucketed batches.

    Indices that appear more than once in ``local`` (the sampler's padding)
    keep their place, so the result stays a permutation.
    """
    order = np.arange(len(lengths)) if order is None else order
    local = np.asarray(local, dtype="int64")
    uniq, counts = np.unique(local, return_counts=True)
    repeated = set(uniq[counts > 1].tolist())
    movable = np.array([i for i in local if i not in repeated], dtype="int64") if repeated else local
    span = batch_size * chunk_batches
    served = []
    for start in range(0, len(movable), span):
        chunk = movable[start:start + span]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches = [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
        rng.shuffle(batches)
        served.append(np.concatenate(batches))
    if served:
        order[movable] = np.concatenate(served)
    return order


class LengthBucketing(Callback):
    """Batches of similar lengths for the training dataset (see the module docstring).

    Events: ``epoch_begin`` (computes this epoch's order). Options:
    ``chunk_batches`` (batches per sorted chunk; larger = less padding, less
    randomness). State: none (the order is recomputed from seed and epoch).
    """

    order = 30

    def __init__(self, dataset: TokenDataset, chunk_batches: int = 50):
        self.dataset = dataset
        self.chunk_batches = int(chunk_batches)

    def on_epoch_begin(self, trainer) -> None:
        a, epoch = trainer.args, trainer.state.epoch
        # the trainer's sampler's readers: ranks of one tensor- or pipeline-parallel group read the same batches
        readers, reader = trainer.layout.data_world_size, trainer.layout.data_rank
        sampler = ResumableDistributedBatchSampler(
            len(self.dataset), a.per_device_train_batch_size, num_replicas=readers, rank=reader,
            shuffle=True, seed=a.data_seed, drop_last=a.dataloader_drop_last)
        sampler.set_epoch(epoch)
        local: List[int] = [i for batch in sampler for i in batch]
        rng = np.random.RandomState((a.data_seed * 1000003 + epoch * 7919 + reader) % (2 ** 32))
        self.dataset.set_order(bucketed_order(local, self.dataset.lengths, a.per_device_train_batch_size,
                                              self.chunk_batches, rng))
