"""Data for the loop: samplers, loaders, streams, column filtering, and what a batch holds.

Owns: the resumable training sampler (with the check of the dataset's length at each
epoch's start) and the sharded evaluation sampler (``samplers``), loaders and their workers, the trainer's
loaders, an epoch's iterator and its next batch (``loader``), reading the next batches
in a thread while the step runs (``read_ahead``; python's and numpy's RNG states read
cheaply and put back: ``host_rng``), how batches come from the
workers (``worker_batches``: fetched whole, handed over through shared-memory
slots), ``IterableDataset`` streams sharded by rank (``iterable``), dropping the
columns a model does not take (``columns``), naming the sample behind a bad batch
(``batch_errors``), and reading a batch's size and labels, and a batch a dataset
assembled itself (``batch``: ``AssembledBatch``, handed on without being collated
again, its arrays from ``batch_array``, in a worker the batch's slot).

May import: ``trainer.errors``, ``trainer.process`` (DataLoader workers die with
the training process); never the loop, callbacks (a stream's position travels in
checkpoints through a callback that imports this room), checkpoints, the launcher
or the commands.

Used by: ``trainer.Trainer`` and ``trainer.evaluation``, ``trainer.loss`` (a batch's labels, the sample behind a
bad one), ``trainer.recipe`` and ``trainer.compat.paddlenlp_recipe`` (the training order), ``trainer.auto_batch``
and ``trainer.parallel.pipeline`` (a batch's size), ``trainer.checkpoint.resume`` (the training set's length),
``callbacks.iterable_dataset_state`` (a stream's position), tasks that bring their own sampler
(``models.ernie.batching``) or build their own batches (``models.resnet.turbo``).
"""

from .loader import InProcessLoader, SeededDataset, close_iterator, dataset_length, make_loader, shutdown_workers
from .samplers import InterleavedEvalSampler, ResumableDistributedBatchSampler, ShardedEvalSampler
from .worker_batches import abandon_iterator

__all__ = ["InProcessLoader", "InterleavedEvalSampler", "ResumableDistributedBatchSampler", "SeededDataset",
           "ShardedEvalSampler", "abandon_iterator", "close_iterator", "dataset_length", "make_loader", "shutdown_workers"]
