"""Trainer: the training loop, evaluation and prediction, on one process or many.

The loop announces events (``trainer.events``); everything optional is a
callback. A step reads top to bottom in :meth:`Trainer._train_step`; the
details (accumulation, clipping, logging reductions) sit in small helpers, and
whole concerns in modules of their own: the model's layout over ranks, applied
once before the loop (``trainer.parallel``: data parallel, sharding, tensor and
pipeline parallel alike), the optimizer and its schedule (``trainer.optim``),
reading and summing the loss (``trainer.loss``).

Hot-path rule: between logging intervals nothing here copies a tensor to the
host. The loss is summed on the device and reduced across ranks only when
``state.should_log`` is set (``_log_training``: the one sync point).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from typing import Any, Callable, Iterable, NamedTuple, Optional

import paddle

from callbacks.base import Callback, CallbackList
from callbacks.defaults import callback_set
from callbacks.iterable_dataset_state import IterableDatasetState

from . import distributed as dist
from .args import TrainingArguments
from .auto_batch import AutoBatch
from .checkpoint import writer as ckpt_writer
from .checkpoint.load import load_checkpoint, reslice_optimizer
from .checkpoint.manifest import checkpoints_dir
from .checkpoint.output_dir import claim
from .checkpoint.fingerprint import begin_fit
from .checkpoint.resume import prepare_resume, resume_after_restart
from .checkpoint.sharded import write as write_checkpoint
from .checkpoint.snapshot import snapshot
from .compat.api import PaddleNLPAPI
from .compat.door import translate_init
from .compat.outputs import PredictionOutput
from .data import ResumableDistributedBatchSampler, SeededDataset, shutdown_workers
from .data import iterable
from .data.loader import (epoch_iterator, epoch_of, eval_loader, killed_worker_of, next_batch, train_loader,
                          worker_killed)
from .data.batch import batch_size, labels_of
from .data.columns import collate_for
from .deploy.export import export_inference_model
from . import process
from .errors import ConfigError, Preempted, TrainerError
from .evaluation import check_eval_sets, compute_metrics_of, eval_sets, logits_from_outputs, run_inference, speed_metrics
from .events import Event
from .heap import frozen_heap
from .layout.adapters import frozen_base
from .loss import (LossWindow, backward, check_loss, eval_loss, forward, loss_from_outputs, loss_of,
                   micro_batch_share)
from .memory_stats import peak_memory_record
from .optim.clipping import clip_before_step, optimizer_grad_clip
from .optim.optimizer import build_optimizer, peak_lr
from .parallel.apply import agreeing_scaler, parallelize
from .seed import set_seed
from .state import TrainerState

logger = logging.getLogger("trainer")


class _LaidOut(NamedTuple):
    """The model, optimizer and scaler ``fit()`` laid out, and what ``trainer.parallel.parallelize`` made of them."""
    model: Any
    optimizer: Any
    scaler: Any
    applied: Any


class Trainer(PaddleNLPAPI):
    """Train, evaluate and predict with a ``paddle.nn.Layer`` on one process or many.

    Args:
        model: the ``paddle.nn.Layer`` to train (not yet wrapped in DataParallel).
        args: :class:`TrainingArguments` (defaults when None).
        train_dataset, eval_dataset: map-style datasets.
        loss_fn: ``loss_fn(outputs, labels)``; when None the model must return the loss.
        collate_fn: passed to ``paddle.io.DataLoader``.
        optimizer: used as given; when None, :meth:`create_optimizer` builds one.
        lr_scheduler: stepped once per optimizer step; when None and the trainer
            builds the optimizer, :meth:`create_lr_scheduler` builds one.
        compute_metrics: ``compute_metrics(EvalPrediction) -> dict`` of floats.
        callbacks: extra :class:`callbacks.Callback` instances, added to the
            default set that ``args`` switches on (see ``callbacks.defaults``);
            PaddleNLP (or PaddleFormers) ``TrainerCallback`` and ``paddle.callbacks.Callback``
            objects are wrapped by adapters (``trainer.compat``).
        **paddlenlp_kwargs: PaddleNLP's constructor keywords (``data_collator``,
            ``criterion``, ``optimizers``, ``tokenizer``,
            ``preprocess_logits_for_metrics``; PaddleFormers' ``processing_class`` and
            ``resume_from_custom_func``); ``args`` may also be a paddlenlp or paddleformers
            ``TrainingArguments``. Translated at the door (``trainer.compat.door``).

    Example::

        trainer = Trainer(model, TrainingArguments(output_dir="out", max_steps=100),
                          train_dataset=ds, loss_fn=paddle.nn.CrossEntropyLoss())
        trainer.fit()
    """

    def __init__(self, model: paddle.nn.Layer, args: Optional[TrainingArguments] = None,
                 train_dataset=None, eval_dataset=None, loss_fn: Optional[Callable] = None,
                 collate_fn: Optional[Callable] = None, optimizer: Optional[paddle.optimizer.Optimizer] = None,
                 lr_scheduler=None, compute_metrics: Optional[Callable] = None,
                 callbacks: Optional[Iterable[Callback]] = None, **paddlenlp_kwargs):
        if not isinstance(model, paddle.nn.Layer):
            raise ConfigError(f"model must be a paddle.nn.Layer, got {type(model).__name__}")
        door = translate_init(args, callbacks, loss_fn, collate_fn, optimizer, lr_scheduler, paddlenlp_kwargs)
        args, callbacks, loss_fn, collate_fn = door.args, door.callbacks, door.loss_fn, door.collate_fn
        optimizer, lr_scheduler = door.optimizer, door.lr_scheduler
        self.tokenizer, self.preprocess_predictions = door.tokenizer, door.preprocess_predictions
        self.recipe = door.recipe  # the choices that decide the numbers: ours, or PaddleNLP's (trainer.recipe)
        self.args = args if args is not None else TrainingArguments()
        if not isinstance(self.args, TrainingArguments):
            raise ConfigError(f"args must be a trainer.TrainingArguments, got {type(self.args).__name__}")
        self.device = dist.select_device(self.args.requested_device)
        self.model = model                 # the user's model, never wrapped
        self.model_wrapped = model         # DataParallel(model) during fit() when world size > 1
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset  # a dataset, or {name: dataset}: each evaluated with prefix eval_<name>
        check_eval_sets(eval_dataset, self.args)
        self.loss_fn = loss_fn
        self.collate_fn = collate_fn
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.compute_metrics = compute_metrics
        # read once: the launcher's environment does not change within a process, and each
        # os.environ read costs microseconds, several times a step (benchmarks/RESULTS.md)
        self._rank, self._world_size = dist.get_rank(), dist.get_world_size()
        self.state = TrainerState(world_size=self._world_size)
        # the model's layout over ranks (trainer.layout): the one the arguments planned (planned again only for a
        # process outside a launch, whose arguments were checked on the fewest ranks the degrees ask for)
        self.layout = self.args.layout_for(self._world_size, self._rank)
        self._parallel: Optional[_LaidOut] = None  # what fit() laid out, and from what
        self._step_runner = None  # Parallelized.step_runner (pipeline parallel), set with the layout
        self._grad_sync = None  # Parallelized.grad_sync: when DataParallel averages the gradients, set with the layout
        self.callbacks = CallbackList(callback_set(self.args, callbacks))  # a user's callback replaces a default of its class
        self.grad_scaler = None            # a loss scaler with GradScaler's step/update (callbacks.AMP, callbacks.NaNGuard); steps the optimizer when set
        self._train_sampler: Optional[ResumableDistributedBatchSampler] = None
        self._seeded_train: Optional[SeededDataset] = None
        self._epoch_batches = None  # the current epoch's batch iterator (trainer.data.read_ahead settles it at a save)
        self._writer = ckpt_writer.CheckpointWriter()
        self._pending_resume: Optional[str] = None
        # what defines the run besides TrainingArguments (a task's options; trainer.checkpoint.resume): saved in
        # every checkpoint, compared on resume. {"source": str, "fields": {name: value}, "may_change": {name: why},
        # "split": [names of fields that choose the split, never allowed to change]}
        self.run_identity: dict = {}
        # what a LoRA model's checkpoints record of its frozen base in place of its tensors (read by fit())
        self.frozen_base: Optional[dict] = None
        self._frozen_base_of = None  # the model it was read from
        self.train_dataloader = self.eval_dataloader = None  # the loaders in use, for callbacks
        self._eval_loaders: dict = {}  # id(dataset) -> (dataset, loader) with persistent workers, during fit()
        self.loss_share = 1.0  # the micro-batch's share of its data batch when auto_find_batch_size cut it (trainer.auto_batch)
        self._auto_batch: Optional[AutoBatch] = None
        self._compat_init_end(door)

    # ---- public facts --------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def is_main_process(self) -> bool:
        return self._rank == 0

    @property
    def inference_model(self) -> paddle.nn.Layer:
        """The model evaluation and prediction run: ``model``, or under sharding stage 3 the wrapper that gathers
        each rank's parameter slices in the forward (``trainer.parallel``)."""
        applied = self._parallel.applied if self._parallel is not None and self._parallel.model is self.model else None
        return applied.inference_model if applied is not None and applied.inference_model is not None else self.model

    def add_callback(self, callback: Callback) -> None:
        for cb in self._adapt(callback):  # PaddleNLP and hapi callbacks join their adapter
            self.callbacks.add(cb)

    def remove_callback(self, callback_or_type) -> None:
        self.callbacks.remove(callback_or_type)
        self._remove_adapted(callback_or_type)  # from the PaddleNLP and hapi adapters too

    def describe_callbacks(self) -> str:
        """The resolved callbacks per event in the order they will run."""
        return self.callbacks.describe()

    def fire(self, event: Event) -> None:
        """Announce ``event`` to the callbacks (public so subclasses can add events)."""
        self.callbacks.fire(event, self)

    # ---- overridable building blocks -----------------------------------------
    def get_train_dataloader(self) -> paddle.io.DataLoader:
        if iterable.is_iterable(self.train_dataset):  # a stream: sharded by rank, resumable (trainer.data.iterable)
            self._train_sampler = iterable.train_batches(self, collate_for(self.model, self.args, self.collate_fn))
            IterableDatasetState.track(self, self._train_sampler)  # its position in checkpoints, when it has state
            return self._train_sampler
        # the order: ours, or PaddleNLP's (trainer.recipe); workers seeded per sample (trainer.data.loader)
        self._train_sampler, self._seeded_train, loader = train_loader(
            self, collate_for(self.model, self.args, self.collate_fn), self._persistent_workers())
        return loader

    def get_eval_dataloader(self, dataset) -> paddle.io.DataLoader:
        if iterable.is_iterable(dataset):
            return iterable.eval_batches(self, dataset, collate_for(self.model, self.args, self.collate_fn))
        persistent = self._persistent_workers()  # one set of workers for every evaluation of this dataset in fit()
        if persistent and self._eval_loaders.get(id(dataset), (None,))[0] is dataset:
            return self._eval_loaders[id(dataset)][1]
        # the ranks of one tensor/pipeline-parallel group read the same batches
        loader = eval_loader(dataset, collate_for(self.model, self.args, self.collate_fn), self.args,
                             self.layout.data_world_size, self.layout.data_rank, persistent, self.recipe.eval_sampler)
        if persistent:
            self._eval_loaders[id(dataset)] = (dataset, loader)
        return loader

    def _persistent_workers(self) -> bool:
        """Keep DataLoader workers across passes: asked for, and inside fit(), which shuts them down."""
        return self.args.dataloader_persistent_workers and self.state.status == "running"

    def _end_workers(self) -> None:
        """Shut down the persistent DataLoader workers of this fit() (training and evaluation)."""
        loaders, self._eval_loaders = [self.train_dataloader, *(v[1] for v in self._eval_loaders.values())], {}
        shutdown_workers(*loaders)

    def create_optimizer(self) -> paddle.optimizer.Optimizer:
        """``args.optim`` over the model's parameters; weight decay only on
        parameters with 2+ dims (matrices, embeddings, kernels), never on biases
        and norm weights (the recipe's choice). Uses ``self.lr_scheduler`` as its learning rate
        (``trainer.optim.optimizer``)."""
        params = [p for p in self.model.parameters() if not p.stop_gradient]
        lr = self.lr_scheduler if self.lr_scheduler is not None else peak_lr(self.args, self.state.global_batch_size)
        clip = optimizer_grad_clip(self.layout, self.args.max_grad_norm)  # sharding: paddle clips inside the step
        return build_optimizer(self.args, lr, params, self.recipe.decay_names(self.model, params), clip,
                               self.layout.summary())

    def create_lr_scheduler(self, total_steps: int):
        """Warmup then ``args.lr_scheduler_type`` decay (``trainer.optim.schedules``; PaddleNLP's under its arguments)."""
        return self.recipe.lr_scheduler(self, total_steps)

    def compute_loss(self, model: paddle.nn.Layer, batch: Any, return_outputs: bool = False):
        """The loss of one micro-batch, in training and in evaluation (``eval_loss``
        is this loss, so an override counts in both, as in PaddleNLP and Hugging Face).

        ``(inputs..., labels)`` sequences: ``loss_fn(model(*inputs), labels)``.
        Dict batches: with ``loss_fn``, ``loss_fn(model(**rest), batch['labels'])``;
        without, ``model(**batch)`` must return the loss (a tensor, a tuple whose
        first item is the loss, or a dict/object with ``loss``), as paddlenlp
        models do when given labels.

        With ``return_outputs=True`` (what evaluation asks for) returns
        ``(loss, outputs)``, the outputs holding the predictions; the loss may then
        be None when the outputs hold none and there is no ``loss_fn``. An override
        without ``return_outputs`` still works: evaluation then runs the model a
        second time for the predictions. The readers are ``trainer.loss``'s.
        """
        outputs, labels = forward(model, batch, self.args.label_names, self.loss_fn)
        if self.loss_fn is not None:
            loss = loss_of(self.loss_fn, outputs, labels, self._current_batch_indices)
        else:
            loss = loss_from_outputs(outputs, required=not return_outputs)
        return (loss, outputs) if return_outputs else loss

    def _current_batch_indices(self):
        """Dataset indices of the micro-batch being trained on (None outside training)."""
        if self._train_sampler is None or self.state.status != "running":
            return None
        k = self.args.gradient_accumulation_steps
        return self._train_sampler.batch_indices(self.state.step_in_epoch * k + self.state.micro_step)

    def training_step(self, model: paddle.nn.Layer, batch: Any) -> paddle.Tensor:
        """Forward (inside the callbacks' contexts), backward; returns the detached loss."""
        with self.callbacks.forward_context(self):
            loss = self.compute_loss(model, batch)
        check_loss(loss)
        self.state.loss = micro_batch_share(loss, self.loss_share, self.state.num_micro_batches)
        self.fire(Event.BACKWARD_BEGIN)
        backward(self.state.loss, batch, self.args.label_names)  # float class labels: a DataError of one line
        self.fire(Event.BACKWARD_END)
        # the graph's nodes (~1,800 small host blocks for a 10-layer Llama) die here, not after the next forward:
        # kept to then, they sit among the next step's activations and fragment the heap (issue 41)
        self.state.loss = self.state.loss.detach()
        return loss.detach()

    def evaluation_step(self, model: paddle.nn.Layer, batch: Any):
        """Returns ``(loss or None, predictions, labels or None)`` for one batch, no gradients.

        The loss is :meth:`compute_loss`'s, the one training minimizes; a batch
        without labels and a ``loss_fn`` gives predictions only."""
        labels = labels_of(batch, self.args.label_names or ["labels"])
        with self.callbacks.forward_context(self):
            loss, outputs = eval_loss(self.compute_loss, model, batch, labels, self.args.label_names, self.loss_fn)
        return loss, logits_from_outputs(outputs), labels

    # ---- fit ------------------------------------------------------------------
    def fit(self, resume_from_checkpoint: Optional[str] = None) -> TrainerState:
        """Train. Returns the final state (``state.status``: completed, stopped or preempted).

        Errors pass through ``on_exception`` then ``on_fit_end`` (status failed)
        and are re-raised.
        """
        if self.train_dataset is None:
            raise ConfigError("fit() needs a train_dataset: Trainer(model, args, train_dataset=...)")
        state = self.state
        state.status, state.should_stop, state.error, state.exit_code = "running", False, None, 0
        resume = resume_after_restart(resume_from_checkpoint or self.args.resume_from_checkpoint, self.args.output_dir)
        lock = claim(self.args, self.is_main_process, resume, state.run_id)  # the run lock; no other run's checkpoints
        state.run_id = lock.run_id  # a second fit() continues its run; a resume takes the resumed run's
        try:
            loader = self._setup_fit(resume)
            clock = (time.time(), state.samples_seen, state.global_step)  # this fit()'s, resumed counters included
            self.fire(Event.FIT_BEGIN)
            # laid out after on_fit_begin: AMP O2 casts the parameters there, and DataParallel and the
            # sharding wrappers bucket gradients by the dtype the parameters have when they are built
            self._parallelize()
            self.model_wrapped.train()
            with frozen_heap():  # the full collections skip what lives as long as the process
                self._train_loop(loader)
            self.wait_for_checkpoint()
            if state.status == "running":
                state.status = "stopped" if state.should_stop and state.global_step < state.max_steps else "completed"
            state.train_metrics = _train_speed(*clock, state)
        except BaseException as exc:
            killed = killed_worker_of(exc)  # an evaluation's or a callback's loader worker, outside the epoch
            error = worker_killed(*killed) if killed is not None else exc
            state.status, state.error = "failed", error
            if isinstance(error, TrainerError):  # under ptrain's launcher: ptrain names it, whichever rank it was
                process.record_failure(self.rank, error)
            self._quietly(self.wait_for_checkpoint)
            self._quietly(lambda: self.fire(Event.EXCEPTION))
            if error is exc:
                raise
            raise error from None
        finally:
            try:
                if state.status == "failed":
                    self._quietly(lambda: self.fire(Event.FIT_END))
                else:
                    self.fire(Event.FIT_END)
            finally:
                self._quietly(self._end_workers)  # persistent DataLoader workers end with fit(), however it ends
                self._writer.buffers.clear()  # the snapshots' host memory goes back with fit()
                lock.release()
        return state

    def _parallelize(self) -> None:
        """Apply ``self.layout`` (``trainer.parallel.parallelize``: recompute, then sharding or data parallel) once
        per model and optimizer: a second fit() with the same ones runs what the first one built."""
        built = self._parallel
        if built is None or built.model is not self.model or \
                not (self.optimizer is built.optimizer or self.optimizer is built.applied.optimizer):
            built = self._parallel = _LaidOut(self.model, self.optimizer, self.grad_scaler,
                                              parallelize(self.model, self.optimizer, self.layout, self.args,
                                                          self.grad_scaler))
        applied = built.applied
        self.model_wrapped, self.optimizer = applied.model, applied.optimizer
        self._step_runner = applied.step_runner  # runs a step's forwards and backwards when the layout has its own
        self._grad_sync = applied.grad_sync  # no_sync around each micro-batch, the deferred all-reduce after the last
        if self.grad_scaler is built.scaler:  # a scaler installed anew by a callback since is kept as it is
            self.grad_scaler = applied.scaler
        self.grad_scaler = agreeing_scaler(self.layout, self.grad_scaler)
        reslice_optimizer(self)  # a resumed optimizer state, cut to the slices sharding stage 3 holds

    @staticmethod
    def _quietly(action) -> None:
        """Run during error handling: a second error is logged, the first one surfaces."""
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - the original error must win
            logger.error("while handling a failure: %s", exc)

    def _setup_fit(self, resume: Optional[str]) -> paddle.io.DataLoader:
        a = self.args
        set_seed(a.seed)
        # before anything is planned: refuse changed settings, set the accumulation a new world size needs
        begin_fit(self.train_dataset, a.data_fingerprint)  # what the files' fingerprint may reuse; content needs files
        if self._frozen_base_of is not self.model:  # once per model, before the layout (AMP O2 casts it in fit())
            self.frozen_base, self._frozen_base_of = frozen_base(self.model), self.model
        resume = prepare_resume(self, resume)
        loader = self.train_dataloader = self.get_train_dataloader()
        self._plan_steps()
        if self.optimizer is None:
            if self.lr_scheduler is None:
                self.lr_scheduler = self.create_lr_scheduler(self.state.max_steps)
            self.optimizer = self.create_optimizer()
        self._losses = LossWindow()
        self._auto_batch = AutoBatch(self.world_size, a.per_device_train_batch_size, self.layout) if a.auto_find_batch_size else None
        if resume:
            self.load_checkpoint(resume)  # restores the partial logging window (_losses) too
            self._plan_steps()  # this run's arguments win over the checkpoint's plan
            self.state.status = "running"
        self.model.train()
        self._log_clock = (time.perf_counter(), self.state.samples_seen, self.state.tokens_seen)
        return loader

    def _plan_steps(self) -> None:
        a, state = self.args, self.state
        k = a.gradient_accumulation_steps
        state.steps_per_epoch = math.ceil(self._train_sampler.batches_per_epoch() / k)
        state.world_size = self.world_size
        state.global_batch_size = a.per_device_train_batch_size * k * self.layout.data_world_size
        if a.max_steps > 0:
            state.max_steps = a.max_steps
        else:
            state.max_steps = math.ceil(a.num_train_epochs * state.steps_per_epoch)
        state.num_train_epochs = math.ceil(state.max_steps / state.steps_per_epoch)

    def _train_loop(self, loader: paddle.io.DataLoader) -> None:
        state = self.state
        start_epoch, start_step = state.epoch, state.step_in_epoch
        for epoch in range(start_epoch, state.num_train_epochs):
            if state.should_stop or state.global_step >= state.max_steps:
                break
            state.epoch = epoch
            state.step_in_epoch = start_step if epoch == start_epoch else 0
            if not iterable.is_iterable(self.train_dataset):  # a length that changed: said, or a DataError (samplers)
                grown = self._train_sampler.length_changed(len(self.train_dataset), epoch)
                if grown and self.is_main_process:
                    logger.warning(grown)
            self._train_sampler.set_epoch(epoch, start_batch=state.step_in_epoch * self.args.gradient_accumulation_steps)
            if self._seeded_train is not None:
                self._seeded_train.set_epoch(epoch)
            self.fire(Event.EPOCH_BEGIN)
            batches = self._epoch_batches = epoch_iterator(loader)  # numpy's RNG left as it was
            with epoch_of(batches):  # its DataLoader workers end with the epoch, or with a stop/failure
                self._train_epoch(batches)
            if state.step_in_epoch >= state.steps_per_epoch:  # the epoch ran to its end
                state.epoch = epoch + 1
                state.step_in_epoch = 0
                self.fire(Event.EPOCH_END)
                self._act_on_flags()

    def _train_epoch(self, batches) -> None:
        state, k = self.state, self.args.gradient_accumulation_steps
        total_batches = self._train_sampler.batches_per_epoch()
        while state.step_in_epoch < state.steps_per_epoch and state.global_step < state.max_steps:
            first = state.step_in_epoch * k
            state.num_micro_batches = min(k, total_batches - first)
            self._train_step(batches)
            self._act_on_flags()
            if state.should_stop:
                break

    def _train_step(self, batches) -> None:
        """One optimizer step over ``state.num_micro_batches`` micro-batches."""
        state = self.state
        step_start = time.perf_counter()
        self.fire(Event.STEP_BEGIN)
        state.last_data_wait = 0.0
        if self._auto_batch is not None:  # cut, agreed on and retried after an out-of-memory (trainer.auto_batch)
            step_loss = self._auto_batch.accumulate(self, batches)
        elif self._step_runner is not None:  # the layout's own (pipeline parallel: paddle's schedule)
            step_loss = self._step_runner(self, lambda: self._next_batch(batches))
        else:
            step_loss = self._accumulate(batches)
        state.step_loss = step_loss
        self._losses.add(step_loss)
        self._optimizer_step()
        state.step_in_epoch += 1
        state.last_step_time = time.perf_counter() - step_start
        self.fire(Event.STEP_END)

    def _accumulate(self, batches):
        """Forward and backward of the step's micro-batches; returns their mean loss (on the device)."""
        n = self.state.num_micro_batches
        step_loss = None
        for i in range(n):
            self.state.micro_step = i
            batch = self._next_batch(batches)
            with self._grad_sync.context(last=i == n - 1):
                loss = self.training_step(self.model_wrapped, batch)
            part = loss / n if n > 1 else loss
            step_loss = part if step_loss is None else step_loss + part
        self._grad_sync.finish()
        return step_loss

    def _next_batch(self, batches):
        start = time.perf_counter()
        batch = next_batch(batches)  # a dry loader, a failed or killed worker: one line (trainer.data.loader)
        waited = time.perf_counter() - start
        self.state.last_data_wait += waited
        self.state.data_wait_time += waited
        readers = self.layout.data_world_size
        self.state.samples_seen += batch_size(batch) * readers
        if isinstance(batch, Mapping) and "input_ids" in batch and hasattr(batch["input_ids"], "shape"):
            self.state.tokens_seen += math.prod(batch["input_ids"].shape) * readers
        return batch

    def _optimizer_step(self) -> None:
        state = self.state
        self.fire(Event.OPTIMIZER_STEP_BEGIN)
        if self.args.max_grad_norm is not None:
            state.grad_norm = self.clip_gradients(self.args.max_grad_norm)
        if state.skip_optimizer_step:
            state.skipped_steps += 1
        elif self.grad_scaler is not None:
            self.grad_scaler.step(self.optimizer)  # skips the update on non-finite gradients
            self.grad_scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.clear_grad()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        state.skip_optimizer_step = False
        state.global_step += 1
        self.fire(Event.OPTIMIZER_STEP_END)

    def clip_gradients(self, max_norm: float) -> paddle.Tensor:
        """Scale gradients so their global L2 norm is at most ``max_norm``.

        Returns the norm before clipping as a device tensor (no host sync); None when the optimizer clips
        inside its step (sharding, master gradients: ``trainer.layout.clips_in_optimizer``).
        """
        # float16/bfloat16 beside float32 (AMP O2); the run's recipe decides the arithmetic (ours or PaddleNLP's)
        return clip_before_step(self.layout, self.model.parameters(), max_norm, clip=self.recipe.clip)

    def current_lr(self) -> float:
        return float(self.optimizer.get_lr())

    def _act_on_flags(self) -> None:
        """Log, evaluate, save, in that order, as the callbacks asked; then clear the flags."""
        self._writer.raise_if_failed()  # a failed background save stops training here
        state = self.state
        if state.should_log:
            state.should_log = False
            self._log_training()
        if state.should_evaluate:
            state.should_evaluate = False
            if self.eval_dataset is not None:
                self.evaluate()
        if state.should_stop and self.args.save_strategy != "no" and not _saved_at_current_step(state):
            state.should_save = True  # a run stopped by a callback keeps its final state, whatever the save interval
        if state.should_save:
            state.should_save = False
            self.save_checkpoint()

    def _log_training(self) -> None:
        """Reduce the mean loss since the last log across ranks (the one host sync) and fire ``log``."""
        state = self.state
        if self._losses.steps == 0:
            return
        mean_loss = dist.all_reduce_mean(self.layout.share_loss(self._losses.total() / self._losses.steps))
        now = time.perf_counter()
        t0, samples0, tokens0 = self._log_clock
        elapsed = max(now - t0, 1e-9)
        record = {
            "step": state.global_step,
            "epoch": round(state.epoch + state.step_in_epoch / max(1, state.steps_per_epoch), 4),
            "loss": float(mean_loss),
            "learning_rate": self.current_lr(),
            "samples_per_second": (state.samples_seen - samples0) / elapsed,
        }
        if state.tokens_seen > tokens0:
            record["tokens_per_second"] = (state.tokens_seen - tokens0) / elapsed
        if state.grad_norm is not None:
            record["grad_norm"] = float(state.grad_norm)
        if not self.args.skip_memory_metrics:  # each rank's high-water marks, the largest over ranks
            record.update(peak_memory_record())
        self._losses.reset()
        self._log_clock = (now, state.samples_seen, state.tokens_seen)
        self.log(record)

    def log(self, record: dict) -> None:
        """Publish a record of host floats to the loggers (``on_log``); every rank calls it."""
        self.state.logs = self.recipe.log_record(self, dict(record))
        self.fire(Event.LOG)
        self.state.log_history.append(dict(self.state.logs))

    # ---- evaluate / predict (the inference loop: trainer.evaluation) -------------
    def evaluate(self, eval_dataset=None, metric_key_prefix: str = "eval") -> dict:
        """Metrics over the whole dataset, identical on every rank.

        Each rank evaluates a contiguous, unpadded shard; losses are summed and
        predictions gathered across ranks, so no sample counts twice or is lost.
        A dict ``{name: dataset}`` evaluates each set with the prefix
        ``<metric_key_prefix>_<name>`` (``eval_val_loss``), all in one evaluation
        (one ``on_eval_begin`` / ``on_eval_end``, one log record).
        """
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ConfigError("evaluate() needs an eval_dataset: Trainer(..., eval_dataset=...) or evaluate(dataset)")
        self._refuse_after_preemption("evaluate()")
        sets = eval_sets(dataset, metric_key_prefix)
        self.fire(Event.EVAL_BEGIN)
        dist.broadcast_buffers(self.model)  # DataParallel leaves each rank its own BatchNorm statistics
        metrics = {}
        for prefix, data in sets:
            start = time.time()
            out = run_inference(self, data, Event.EVAL_STEP_BEGIN, Event.EVAL_STEP_END)
            metrics.update(compute_metrics_of(self, out, prefix))
            metrics[f"{prefix}_samples"] = out.count
            metrics.update(speed_metrics(prefix, start, out.count, self.args.per_device_eval_batch_size))
        self.state.metrics = dict(metrics)
        self.fire(Event.EVAL_END)
        self.log({"step": self.state.global_step, **self.state.metrics})
        return self.recipe.eval_result(self, self.state.metrics)

    def _refuse_after_preemption(self, what: str) -> None:
        """After a preempted fit() the job is stopping and ranks leave: no collective may start. Every rank
        agreed on the preemption, so every rank raises here, at the same call."""
        if self.state.status == "preempted" and self.state.exit_code:
            import signal

            name = signal.Signals(self.state.exit_code - 128).name
            raise Preempted(f"{what} after a preempted fit() ({name}): skipped on every rank, the job is stopping; "
                            f"exiting {self.state.exit_code}. Resume with resume_from_checkpoint=\"auto\" to finish "
                            "and evaluate", self.state.exit_code - 128)

    def predict(self, dataset) -> PredictionOutput:
        """Predictions (numpy, dataset order) on every rank, and metrics when labels exist."""
        self._refuse_after_preemption("predict()")
        self.fire(Event.PREDICT_BEGIN)
        start = time.time()
        out = run_inference(self, dataset, None, None)
        metrics = compute_metrics_of(self, out, "test")
        metrics.update(speed_metrics("test", start, out.count, self.args.per_device_eval_batch_size))
        result = PredictionOutput(out.predictions, out.label_ids, metrics)
        self.fire(Event.PREDICT_END)
        return result

    # ---- export ------------------------------------------------------------------
    def export(self, path: Optional[str] = None, input_spec=None, sample_batch=None) -> str:
        """Save an inference model with ``paddle.jit.save`` and check it (see ``trainer.deploy.export``)."""
        return export_inference_model(self, path, input_spec=input_spec, sample_batch=sample_batch)

    # ---- checkpoints -----------------------------------------------------------
    def save_checkpoint(self, path: Optional[str] = None) -> str:
        """Save a complete checkpoint; returns its directory (every rank must call it).

        The state is copied to host memory now; the files are written by a
        background thread when ``args.save_async`` (the next save, the end of
        fit() and :meth:`wait_for_checkpoint` wait for it), else before this
        returns. Without ``path`` it goes to ``output_dir/checkpoints/step-N``
        and moves ``checkpoints/latest`` once complete. Within fit() the host
        copy goes into memory kept from the previous save (``trainer.checkpoint.host_buffers``).
        """
        self.fire(Event.SAVE_BEGIN)
        root = checkpoints_dir(self.args.output_dir)
        final = path or os.path.join(root, f"step-{self.state.global_step}")
        dist.broadcast_buffers(self.model)  # the saved BatchNorm statistics are the ones every rank uses
        settle = getattr(self._epoch_batches, "settle", None)
        if settle is not None:  # a batch read ahead that drew randomness is undone: the RNGs saved are the step's
            settle()
        self._writer.join()  # a write in flight hands its host buffers back first (its error is raised below)
        snap = snapshot(self, self._writer.buffers if self.state.status == "running" else None)  # reused within fit()
        if snap:  # rank 0; every rank when the ranks hold different state (trainer.checkpoint.sharded)
            self._writer.wait()
            if self.is_main_process:
                ckpt_writer.remove_stale_temporaries(root)
            self._writer.submit(lambda: write_checkpoint(snap, final, None if path else root),
                                background=self.args.save_async)
        self.state.last_checkpoint = final
        self.fire(Event.SAVE_END)
        return final

    def wait_for_checkpoint(self) -> None:
        """Block until the checkpoint being written is complete; raise its error if it failed."""
        self._writer.wait()

    def load_checkpoint(self, path) -> None:
        """Restore model, optimizer, scheduler, state, callbacks and RNG from ``path``
        (a checkpoint directory, or ``auto`` for the latest in ``output_dir``; fit() hands on
        the checkpoint its resume check has already read and verified)."""
        self.fire(Event.LOAD_BEGIN)
        load_checkpoint(self, path)
        self.fire(Event.LOAD_END)


# ---- small helpers ------------------------------------------------------------
def _saved_at_current_step(state: TrainerState) -> bool:
    return bool(state.last_checkpoint) and os.path.basename(state.last_checkpoint) == f"step-{state.global_step}"


def _train_speed(start: float, samples0: int, steps0: int, state: TrainerState) -> dict:
    """PaddleNLP's (and Hugging Face's) names for a fit()'s speed: the one set, in state, results.json and train()."""
    runtime = max(time.time() - start, 1e-9)
    return {"train_runtime": round(runtime, 4),
            "train_samples_per_second": round((state.samples_seen - samples0) / runtime, 4),
            "train_steps_per_second": round((state.global_step - steps0) / runtime, 4)}
