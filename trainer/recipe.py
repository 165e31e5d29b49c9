"""Recipe: the choices inside the trainer's building blocks that decide a run's
numbers, in one object: the order of the training data (and how a stream is dealt to the ranks), which parameters get
weight decay, the learning-rate schedule, gradient clipping, and the form of a
log record.

``Recipe`` is this project's. ``trainer.compat.paddlenlp_recipe`` holds
PaddleNLP's Trainer's, which a PaddleNLP ``TrainingArguments`` brings through
the door (``trainer.compat.door``), and ``trainer.compat.paddleformers_recipe``
PaddleFormers': a script that swaps only its ``Trainer`` import logs its
framework's numbers, while a run with our ``TrainingArguments`` keeps ours. The loop never asks which recipe it has; the building blocks
(``get_train_dataloader``, ``create_optimizer``, ``create_lr_scheduler``,
``clip_gradients``, ``log``) delegate to ``trainer.recipe``.

    >>> Recipe().log_record(None, {"step": 1, "loss": 0.5})
    {'step': 1, 'loss': 0.5}
"""

from __future__ import annotations

from collections.abc import Iterable

from .data import ResumableDistributedBatchSampler
from .optim.clipping import clip_grad_norm
from .optim.optimizer import peak_lr
from .optim.schedules import build_scheduler


class Recipe:
    """This project's choices."""

    name = "ours"

    def train_sampler(self, trainer, dataset_len: int) -> ResumableDistributedBatchSampler:
        """Epoch ``e`` shuffled with ``RandomState(data_seed + e)``, the same on every world size."""
        a = trainer.args
        return ResumableDistributedBatchSampler(
            dataset_len, a.per_device_train_batch_size, num_replicas=trainer.layout.data_world_size,
            rank=trainer.layout.data_rank, shuffle=True, seed=a.data_seed, drop_last=a.dataloader_drop_last)

    def stream_block(self, batch_size: int) -> int:
        """How an IterableDataset is dealt to the ranks: 1, sample by sample (``trainer.data.iterable``)."""
        return 1

    #: the evaluation sampler's class (None: ``trainer.data.ShardedEvalSampler``, contiguous shards)
    eval_sampler = None

    def decay_names(self, model, params: Iterable) -> set[str]:
        """Weight decay on parameters with 2+ dims (matrices, embeddings, kernels), never biases and norm weights."""
        return {p.name for p in params if p.ndim >= 2}

    def lr_scheduler(self, trainer, total_steps: int):
        """Warmup then ``args.lr_scheduler_type`` decay (``trainer.optim.schedules``)."""
        a = trainer.args
        return build_scheduler(a, total_steps, trainer.state.steps_per_epoch, peak_lr(a, trainer.state.global_batch_size))

    def clip(self, parameters, max_norm: float):
        """Scale gradients to a global L2 norm of at most ``max_norm``; returns the norm (device tensor)."""
        return clip_grad_norm(parameters, max_norm)  # float16/bfloat16 beside float32 (AMP O2)

    def log_record(self, trainer, record: dict) -> dict:
        """The record as the loggers and ``log_history`` get it."""
        return record

    def eval_result(self, trainer, metrics: dict) -> dict:
        """What ``evaluate()`` returns, from the metrics it computed."""
        return metrics
