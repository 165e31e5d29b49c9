"""PaddleFormers' Trainer's numbers: the recipe (``trainer.recipe``) a PaddleFormers
``TrainingArguments`` brings through the door, so that a PaddleFormers 1.2 script with
only its ``Trainer`` import changed logs what its own Trainer logs.

It is PaddleNLP's recipe (``trainer.compat.paddlenlp_recipe``: decay rule, clipping, the
loss and lr as logged) with PaddleFormers' changes:

=====================  ===========================================================
what                   PaddleFormers 1.2 (``paddleformers.trainer.Trainer``)
=====================  ===========================================================
data order, 1 process  ``MappingBatchSampler``: ``paddle.seed(seed + e)`` then
                       ``paddle.randperm(n)``
data order, N procs    ``MappingDistributedBatchSampler``: the same draw over the
                       first ``n // N * N`` samples (no padding), rank ``r`` takes
                       every ``N``-th from ``r``
evaluation, N procs    its ``MappingDistributedBatchSampler`` unshuffled: rank ``r``
                       reads ``r, r + N, ...`` (``InterleavedEvalSampler``; the last
                       ``n % N`` samples are read too, which it leaves out)
LR schedule            its ``get_scheduler``, with ``min_lr``
log record             PaddleNLP's, plus ``cpu_used_memory`` and
                       ``cpu_available_memory`` (GiB, 2 places)
=====================  ===========================================================

Its sampler reseeds paddle's global generator at each epoch's start; so does this order, at
the same point (``set_epoch``, in the loop's thread, never in a thread reading batches ahead), so that
what draws from it afterwards (dropout) draws the same numbers.
"""

from __future__ import annotations

import numpy as np
import paddle

from ..data import InterleavedEvalSampler, ResumableDistributedBatchSampler
from .paddlenlp_recipe import PaddleNLPRecipe


class PaddleFormersOrder(ResumableDistributedBatchSampler):
    """PaddleFormers' training order: epoch ``e`` is ``paddle.randperm`` after ``paddle.seed(seed + e)``,
    over the first ``n // nranks * nranks`` samples; rank ``r`` takes positions ``r, r + nranks, ...``."""

    def __init__(self, dataset_len: int, batch_size: int, num_replicas: int = 1, rank: int = 0,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False):
        super().__init__(dataset_len, batch_size, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        if num_replicas > 1:  # floor, no padding (MappingDistributedBatchSampler)
            self.total_size = dataset_len // num_replicas * num_replicas
            self.num_samples = self.total_size // num_replicas
        self._drawn: dict = {}

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """As theirs at an epoch's start (in the loop's thread): paddle's global generator seeded with
        ``seed + epoch``, then the permutation drawn from it; what draws from it next (dropout) draws as there."""
        super().set_epoch(epoch, start_batch)
        if self.shuffle:
            self._drawn = {epoch: self._draw(epoch)}  # one epoch at a time

    def _draw(self, epoch: int) -> np.ndarray:
        paddle.seed(self.seed + epoch)
        return paddle.randperm(self.total_size).numpy().astype(np.int64)

    def _global_indices(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.total_size, dtype=np.int64)
        if self.epoch in self._drawn:
            return self._drawn[self.epoch]
        state = paddle.get_rng_state()  # an epoch not started (a question about its batches): no side effect
        try:
            return self._draw(self.epoch)
        finally:
            paddle.set_rng_state(state)

    def _local_indices(self) -> np.ndarray:
        indices = self._global_indices()
        return indices if self.nranks == 1 else indices[self.local_rank::self.nranks]


class PaddleFormersRecipe(PaddleNLPRecipe):
    """PaddleFormers 1.2's Trainer's choices, read from the paddleformers ``TrainingArguments`` given."""

    # evaluation on several processes: samples dealt to the ranks in turn, as its MappingDistributedBatchSampler (the
    # batches, so a batch-mean eval_loss, are its own)
    eval_sampler = InterleavedEvalSampler

    name = "paddleformers"

    def train_sampler(self, trainer, dataset_len: int) -> ResumableDistributedBatchSampler:
        a = trainer.args
        self.start_interval(trainer)
        return PaddleFormersOrder(dataset_len, a.per_device_train_batch_size,
                                  num_replicas=trainer.layout.data_world_size, rank=trainer.layout.data_rank,
                                  shuffle=bool(getattr(self.pargs, "dataloader_shuffle", True)),
                                  seed=int(self.pargs.seed or 0), drop_last=a.dataloader_drop_last)

    def schedule(self, warmup: int, decay_steps: int):
        """paddleformers' ``get_scheduler``, with ``min_lr``; ``freeze_training``: a constant 0."""
        from paddleformers.trainer.trainer_utils import get_constant_schedule, get_scheduler

        p = self.pargs
        if getattr(p, "freeze_training", False):
            return get_constant_schedule(learning_rate=0.0)
        return get_scheduler(p.lr_scheduler_type, learning_rate=p.learning_rate, num_warmup_steps=warmup,
                             num_training_steps=decay_steps, num_cycles=p.num_cycles, lr_end=p.lr_end, power=p.power,
                             min_lr=p.min_lr)

    def log_record(self, trainer, record: dict) -> dict:
        """PaddleNLP's record plus PaddleFormers' host memory figures (every record its ``log()`` makes)."""
        import psutil

        out = super().log_record(trainer, record)
        mem = psutil.virtual_memory()
        out["cpu_used_memory"] = round(mem.used / (1024 ** 3), 2)
        out["cpu_available_memory"] = round(mem.available / (1024 ** 3), 2)
        return out
