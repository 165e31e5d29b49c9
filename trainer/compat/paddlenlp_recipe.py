"""PaddleNLP's Trainer's numbers: the recipe (``trainer.recipe``) a PaddleNLP
``TrainingArguments`` brings through the door, so that a PaddleNLP script with
only its ``Trainer`` import changed logs what PaddleNLP 2.8's Trainer logs.

=====================  ===============================  ===================================
what                   ours (``trainer.recipe.Recipe``)  PaddleNLP's (this recipe)
=====================  ===============================  ===================================
data order, 1 process  ``RandomState(data_seed + e)``   the ``e+1``-th ``choice(n, n)`` of
                                                        numpy seeded with ``seed``
                                                        (``paddle.io.BatchSampler``)
data order, N procs    the same                         ``RandomState(e)``, padded
                                                        (``DistributedBatchSampler``)
a stream, N procs      sample ``i`` to rank ``i % N``   a batch at a time (``IterableDatasetShard``)
weight decay           parameters with 2+ dims          names without "bias" or "norm"
LR schedule            ramp ``(n+1)/(w+1)``,            paddlenlp's ``get_scheduler``:
                       ``w = ceil(ratio * steps)``      ramp ``n/w``, ``w = int(ratio * steps)``
clipping               norm of norms, ``+1e-6``         ``ClipGradByGlobalNorm``'s formula
log record             ``epoch``, ``grad_norm``,        ``progress_or_epoch``, ``global_step``,
                       speeds                           ``interval_*``; lr as ``%.3e``;
                                                        loss rounded to 8 places
=====================  ===============================  ===================================

Each position is a closed form of (seed, epoch), so a resumed run continues
the same order. The schedule is paddlenlp's own function (paddlenlp is
installed: the arguments came from it).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np
import paddle
from paddle import _C_ops

from ..data import ResumableDistributedBatchSampler
from ..recipe import Recipe


class PaddleNLPOrder(ResumableDistributedBatchSampler):
    """PaddleNLP's Trainer's training order. One process: ``paddle.io.BatchSampler(shuffle=True)``'s
    ``RandomSampler`` draws ``np.random.choice(n, n, replace=False)`` from numpy's global state,
    which PaddleNLP's Trainer seeds with ``seed`` at construction: epoch ``e`` is the ``e+1``-th
    draw of ``RandomState(seed)``. Several: ``paddle.io.DistributedBatchSampler``, ``RandomState(e)``."""

    def __init__(self, *args, numpy_seed: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.numpy_seed = numpy_seed
        self._draws: list = []

    def _global_indices(self) -> np.ndarray:
        if self.nranks > 1 or not self.shuffle:
            return super()._global_indices()
        if not self._draws:
            self._state = np.random.RandomState(self.numpy_seed)
        while len(self._draws) <= self.epoch:
            self._draws.append(self._state.choice(np.arange(self.dataset_len), self.dataset_len, replace=False))
        return self._draws[self.epoch]


class PaddleNLPRecipe(Recipe):
    """PaddleNLP 2.8's Trainer's choices, read from the paddlenlp ``TrainingArguments`` given."""

    name = "paddlenlp"

    def __init__(self, paddlenlp_args):
        self.pargs = paddlenlp_args
        self._last_step, self._last_time = 0, None

    def train_sampler(self, trainer, dataset_len: int) -> ResumableDistributedBatchSampler:
        a = trainer.args
        self.start_interval(trainer)
        return PaddleNLPOrder(dataset_len, a.per_device_train_batch_size, num_replicas=trainer.layout.data_world_size,
                              rank=trainer.layout.data_rank, shuffle=True, seed=0, drop_last=a.dataloader_drop_last,
                              numpy_seed=a.seed)

    def stream_block(self, batch_size: int) -> int:
        """An IterableDataset on N ranks: ``IterableDatasetShard``'s blocks of a batch (``trainer.data.iterable``)."""
        return batch_size

    def decay_names(self, model, params: Iterable) -> set[str]:
        keep = {p.name for p in params}
        return {p.name for n, p in model.named_parameters()
                if p.name in keep and not any(nd in n for nd in ("bias", "norm"))}

    def start_interval(self, trainer) -> None:
        """The first logging interval's start (its ``interval_*`` speeds), as the training data is first asked for."""
        self._last_step, self._last_time = trainer.state.global_step, time.time()

    def lr_scheduler(self, trainer, total_steps: int):
        """Its warmup (``warmup_steps``, else ``int(warmup_ratio * steps)``) and decay steps (``decay_steps`` when
        set), then its own schedule (:meth:`schedule`)."""
        p = self.pargs
        warmup = p.warmup_steps if p.warmup_steps > 0 else int(p.warmup_ratio * total_steps)
        decay_steps = p.decay_steps if (getattr(p, "decay_steps", 0) or 0) > 0 else total_steps
        sched = self.schedule(warmup, decay_steps)
        sched.includes_warmup = True  # callbacks.LRWarmup leaves it as it is
        return sched

    def schedule(self, warmup: int, decay_steps: int):
        """paddlenlp's ``get_scheduler`` over these arguments."""
        from paddlenlp.trainer.trainer_utils import get_scheduler

        p = self.pargs
        return get_scheduler(p.lr_scheduler_type, learning_rate=p.learning_rate, num_warmup_steps=warmup,
                             num_training_steps=decay_steps, num_cycles=p.num_cycles, lr_end=p.lr_end, power=p.power)

    def clip(self, parameters, max_norm: float):
        """``paddle.nn.ClipGradByGlobalNorm``'s arithmetic, in place: sqrt of the summed squares,
        times ``max_norm / max(norm, max_norm)``."""
        with paddle.no_grad():
            grads = [p.grad for p in parameters if p.grad is not None]
            if not grads:
                return paddle.zeros([], dtype="float32")
            # paddle's fused kernel, as ClipGradByGlobalNorm: no gradient-sized temporaries (a cast and a square of
            # every gradient each step fragmented the host heap, issue 41)
            squares = [_C_ops.squared_l2_norm(g if g.dtype == paddle.float32 else g.astype("float32")).reshape([])
                       for g in grads]
            norm = paddle.sqrt(paddle.add_n(squares) if len(squares) > 1 else squares[0])
            limit = paddle.full([], max_norm, dtype="float32")
            coef = limit / paddle.maximum(norm, limit)
            for g in grads:
                g.multiply_(coef if g.dtype == paddle.float32 else coef.astype(g.dtype))
            return norm

    def log_record(self, trainer, record: dict) -> dict:
        """PaddleNLP's keys: a training record gets ``global_step`` and ``interval_*`` speeds (lr as
        ``%.3e``, loss to 8 places), every record ``progress_or_epoch``; no ``epoch``, ``grad_norm``,
        ``*_per_second`` of ours, ``tokens_per_second``, ``eval_samples``."""
        s = trainer.state
        epoch = round(s.epoch + s.step_in_epoch / max(1, s.steps_per_epoch), 4)
        out = {k: v for k, v in record.items()
               if k not in ("epoch", "grad_norm", "samples_per_second", "tokens_per_second")
               and not (k.startswith("eval") and k.endswith("_samples"))}
        if "loss" in record and "learning_rate" in record:
            now = time.time()
            steps = max(1, s.global_step - self._last_step)
            runtime = now - (self._last_time or now)
            out["loss"] = round(float(record["loss"]), 8)
            out["learning_rate"] = float("{0:.3e}".format(record["learning_rate"]))
            out["global_step"] = int(s.global_step)
            batch = trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps * trainer.world_size
            out["interval_runtime"] = round(runtime, 4)
            out["interval_samples_per_second"] = round(batch * steps / max(runtime, 1e-9), 4)
            out["interval_steps_per_second"] = round(steps / max(runtime, 1e-9), 4)
            self._last_step, self._last_time = s.global_step, now
        out["progress_or_epoch"] = epoch
        return out

    def eval_result(self, trainer, metrics: dict) -> dict:
        """What ``evaluate()`` returns: PaddleNLP's ``log()`` adds ``progress_or_epoch`` to the dict it returns."""
        out = self.log_record(trainer, metrics)
        return out
