"""``paddle.io.IterableDataset`` for training and evaluation.

Training on a stream has no epochs to count, so it needs ``max_steps > 0``
(as in PaddleNLP); the whole run is one epoch of ``max_steps x
gradient_accumulation_steps`` micro-batches. When the stream ends before
that, it is iterated again (a new pass; ``dataset.set_epoch(pass)`` is called
when the dataset has it).

- **Sharded by rank**: with N processes, rank r takes samples r, r+N, r+2N,
  ... of every pass (each rank reads the stream and keeps its share). The
  recipe may ask for blocks instead (``Recipe.stream_block``): rank r takes
  the r-th run of ``block`` samples of every ``block x N``, as PaddleNLP's and
  PaddleFormers' ``IterableDatasetShard`` does with block = the batch size (in
  evaluation its last, short group is filled from its first, as theirs).
- **Loading** happens in the main process, ``per_device_train_batch_size``
  samples at a time through ``collate_fn``; ``dataloader_num_workers`` is not
  used for a stream (a warning says so).
- **Resume rule**: when the dataset has ``state_dict()`` and
  ``load_state_dict()``, its state (one per rank) travels in every checkpoint
  and a resumed run continues exactly where the stream was
  (``callbacks.iterable_dataset_state``, which the trainer adds); otherwise the
  resumed run skips the batches already consumed (reading them again), with
  a warning.
- **Evaluation / prediction** read the stream once, sharded the same way;
  the gathered predictions come in rank-interleaved order, not stream order.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import paddle

from ..errors import DataError
from .loader import to_tensors

logger = logging.getLogger("trainer")


def is_iterable(dataset) -> bool:
    return isinstance(dataset, paddle.io.IterableDataset)


def _rank_share(dataset, rank: int, world: int, start: int = 0, on_take: Optional[Callable] = None, block: int = 1):
    """Rank ``rank``'s samples of one pass, ``block`` at a time; ``start`` is the stream index the iteration
    begins at."""
    for i, sample in enumerate(dataset, start):
        if (i // block) % world == rank:
            if on_take is not None:
                on_take(i + 1)
            yield sample


def _padded_block_share(dataset, rank: int, world: int, block: int):
    """One pass as ``IterableDatasetShard`` deals it: rank ``rank``'s block of each ``block x world`` group,
    the last short group filled with the first group's samples."""
    group, first = [], None
    for sample in dataset:
        group.append(sample)
        if len(group) == block * world:
            yield from group[rank * block:(rank + 1) * block]
            first, group = first or group, []
    if group:
        first = first or list(group)
        while len(group) < block * world:
            group += first
        yield from group[rank * block:(rank + 1) * block]


def _batched(samples, batch_size: int, collate_fn: Callable, drop_last: bool):
    buffer = []
    for sample in samples:
        buffer.append(sample)
        if len(buffer) == batch_size:
            yield to_tensors(collate_fn(buffer))
            buffer = []
    if buffer and not drop_last:
        yield to_tensors(collate_fn(buffer))


class IterableBatches:
    """The training batches of a stream; plays the sampler's part for the trainer
    (``batches_per_epoch``, ``set_epoch``) and is its own loader."""

    def __init__(self, dataset, batch_size: int, rank: int, world: int, collate_fn: Callable,
                 total_batches: int, drop_last: bool, block: int = 1):
        self.dataset, self.batch_size, self.rank, self.world, self.block = dataset, batch_size, rank, world, block
        self.collate_fn, self.total_batches, self.drop_last = collate_fn, total_batches, drop_last
        self.start_batch = 0
        self.restored = False  # the dataset's own state was loaded from a checkpoint: nothing to skip
        self.restored_position = None
        self.position = (0, 0)  # (pass, stream index of the next sample) after the last batch handed out

    def batches_per_epoch(self) -> int:
        return self.total_batches

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.start_batch = start_batch

    def __len__(self) -> int:
        return self.total_batches - self.start_batch

    def __iter__(self):
        skip = 0 if self.restored else self.start_batch
        self.restored_position = self.position if self.restored else None
        self.restored = False
        if skip:
            logger.warning("resuming an IterableDataset without state_dict()/load_state_dict(): reading and skipping "
                           "the %d batches already consumed", skip)
        for batch in self._stream():
            if skip:
                skip -= 1
                continue
            yield batch

    def _stream(self):
        restored = self.restored_position
        passes, start = restored if restored else (0, 0)
        self.restored_position = None
        while True:
            if hasattr(self.dataset, "set_epoch") and not (restored and start):
                self.dataset.set_epoch(passes)
            produced, taken = 0, [start]
            shard = _rank_share(self.dataset, self.rank, self.world, start, on_take=lambda i: taken.__setitem__(0, i),
                                block=self.block)
            for batch in _batched(shard, self.batch_size, self.collate_fn, self.drop_last):
                produced += 1
                self.position = (passes, taken[0])
                yield batch
            if produced == 0:
                raise DataError(f"the training IterableDataset yielded no batch for rank {self.rank} of {self.world}: "
                                "check the data source (a stream needs at least one batch per process)")
            passes, start, restored = passes + 1, 0, None


class IterableEval:
    """One sharded pass over an evaluation stream."""

    def __init__(self, dataset, batch_size: int, rank: int, world: int, collate_fn: Callable, block: int = 1):
        self.dataset, self.batch_size, self.rank, self.world, self.collate_fn = dataset, batch_size, rank, world, collate_fn
        self.block = block

    def __iter__(self):
        share = (_padded_block_share(self.dataset, self.rank, self.world, self.block) if self.block > 1 and self.world > 1
                 else _rank_share(self.dataset, self.rank, self.world))
        return _batched(share, self.batch_size, self.collate_fn, False)


def train_batches(trainer, collate_fn: Optional[Callable]) -> IterableBatches:
    """The training 'loader' of an IterableDataset (see the module docstring)."""
    from paddle.io.dataloader.collate import default_collate_fn

    a = trainer.args
    if a.max_steps <= 0:
        raise DataError("the training dataset is an IterableDataset, which has no length: set max_steps "
                        "(e.g. --max_steps 1000)")
    if a.dataloader_num_workers > 0 and trainer.is_main_process:
        logger.warning("dataloader_num_workers=%d is not used for an IterableDataset: it is read in the main process",
                       a.dataloader_num_workers)
    return IterableBatches(trainer.train_dataset, a.per_device_train_batch_size, trainer.layout.data_rank,
                           trainer.layout.data_world_size,
                           collate_fn or default_collate_fn, a.max_steps * a.gradient_accumulation_steps,
                           a.dataloader_drop_last, block=trainer.recipe.stream_block(a.per_device_train_batch_size))


def eval_batches(trainer, dataset, collate_fn: Optional[Callable]) -> IterableEval:
    from paddle.io.dataloader.collate import default_collate_fn

    return IterableEval(dataset, trainer.args.per_device_eval_batch_size, trainer.layout.data_rank,
                        trainer.layout.data_world_size,
                        collate_fn or default_collate_fn, block=trainer.recipe.stream_block(trainer.args.per_device_eval_batch_size))
