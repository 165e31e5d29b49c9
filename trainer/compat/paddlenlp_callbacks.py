"""PaddleNLPCallbacks: runs PaddleNLP (and PaddleFormers) ``TrainerCallback`` objects on this
project's events, as their ``CallbackHandler`` would.

PaddleFormers' ``TrainerCallback`` is PaddleNLP's with one more hook, ``on_save_hf``, and one more
flag, ``control.should_save_hf``; its ``TrainerState`` adds ``consumed_samples``. The same adapter
runs both: ``args``, ``state`` and ``control`` are of the framework the callbacks come from.

One adapter holds every PaddleNLP callback of a trainer, in the order given,
and calls each hook with ``(args, state, control, **kwargs)``:

- ``args``: the paddlenlp ``TrainingArguments`` the trainer was given, else a
  view of ours (``greater_is_better`` resolved, as PaddleNLP resolves it);
- ``state``: a paddlenlp ``TrainerState`` (global_step, float epoch,
  max_steps, num_train_epochs, log_history, best_metric,
  best_model_checkpoint, is_world_process_zero, is_local_process_zero),
  refreshed from ``trainer.state`` before every hook, with PaddleNLP's values
  at that hook: at ``on_optimizer_end`` ``global_step`` is the count before
  this step (PaddleNLP increments after the hook; this trainer before
  ``optimizer_step_end``, which its own callbacks rely on, so the view is
  shifted rather than the event contract);
- ``control``: a paddlenlp ``TrainerControl`` that mirrors the trainer's flags
  (``should_log``, ``should_evaluate``, ``should_save``,
  ``should_training_stop`` = ``state.should_stop``); what a hook sets (or the
  control it returns) is written back, so the trainer honours it;
- kwargs: model, tokenizer, optimizer, lr_scheduler, train_dataloader,
  eval_dataloader, plus ``metrics`` (on_evaluate), ``logs`` (on_log),
  ``scaler`` (on_optimizer_begin/end).

=======================  ===============================================  ====================
PaddleNLP hook           fired on                                         here
=======================  ===============================================  ====================
on_init_end              end of ``Trainer.__init__`` (callbacks given     ``init_end``
                         there)
on_train_begin           ``fit_begin``                                    ``on_fit_begin``
on_epoch_begin/_end      ``epoch_begin`` / ``epoch_end`` (and, as in      ``on_epoch_*``
                         PaddleNLP, once more when training stops inside
                         an epoch)
on_step_begin/_end       ``step_begin`` / ``step_end``                    ``on_step_*``
on_substep_end           ``backward_end`` of every micro-batch but the    ``on_backward_end``
                         last
on_optimizer_begin/_end  ``optimizer_step_begin`` / ``_end``              ``on_optimizer_*``
on_log                   ``log``                                          ``on_log``
on_prediction_step       ``eval_step_end``; in ``predict()``, once per        ``on_eval_step_end``,
                         batch at ``predict_end``                         ``on_predict_end``
on_evaluate              after the evaluation's ``log``, as in PaddleNLP  ``on_log``
on_save                  ``save_end`` (PaddleFormers: after a record       ``on_save_end``
                         ``{"global_save_step": step}`` at a logging step)
on_train_end             ``fit_end`` (completed or stopped); with         ``on_fit_end``
                         ``train()``, after its summary ``log``
on_save_hf               (PaddleFormers) last in a step whose control     the next
                         has ``should_save_hf`` (set by a callback, or    ``on_step_begin``,
                         by ``save_hf_steps`` with                        ``on_epoch_end``,
                         ``save_strategy="steps"``), after its log,       ``on_fit_end``
                         evaluation and save,
                         once the model is saved with ``save_pretrained``
                         to ``<output_dir>/hf_checkpoint-<step>``; as
                         PaddleFormers 1.2, only with
                         ``save_checkpoint_format="flex_checkpoint"`` (its
                         default); then ``save_hf_total_limit`` keeps
                         the newest N such folders
=======================  ===============================================  ====================

Not fired: ``on_load_data_end`` (no per-batch event here).
``control.should_epoch_stop`` is not supported (warned once).
"""

from __future__ import annotations

import logging

from .foreign import ForeignCallbacks

logger = logging.getLogger("trainer")
_FLAGS = (("should_log", "should_log"), ("should_evaluate", "should_evaluate"), ("should_save", "should_save"),
          ("should_training_stop", "should_stop"))


class _ArgsView:
    """Our TrainingArguments seen by PaddleNLP callbacks: greater_is_better resolved."""

    def __init__(self, args):
        self._args = args

    def __getattr__(self, name):
        return getattr(self._args, name)

    @property
    def greater_is_better(self):
        return self._args.greater_is_better_resolved if self._args.metric_for_best_model else self._args.greater_is_better


class PaddleNLPCallbacks(ForeignCallbacks):
    order = 50

    def __init__(self):
        super().__init__()
        self.paddlenlp_args = None      # set by the door when the trainer was given paddlenlp arguments
        self.resume_from_custom_func = None  # PaddleFormers' Trainer(resume_from_custom_func=...), set by the door
        self._hf_step = False  # a PaddleFormers step ended whose should_save_hf is looked at after its log and save
        self._pstate = None
        self._control = None
        self._pending_metrics = None    # metrics of an evaluation whose on_evaluate waits for its on_log
        self._best_before_eval = None
        self._epoch_open = False
        self._train_end_deferred = False
        self._warned_epoch_stop = False

    @property
    def state_key(self) -> str:
        return "PaddleNLPCallbacks"

    # ---- membership (PaddleNLP's CallbackHandler) -------------------------------
    def append(self, callback) -> None:
        cb = self.instance(callback)
        if any(type(c) is type(cb) for c in self.callbacks):
            logger.warning("adding a second %s to the callbacks of this trainer", type(cb).__name__)
        self.callbacks.append(cb)

    # ---- the PaddleNLP view of the trainer ---------------------------------------
    def origin(self) -> str:
        """``paddleformers`` when the arguments or the callbacks come from it, else ``paddlenlp``."""
        for obj in [self.paddlenlp_args, *self.callbacks]:
            for c in type(obj).__mro__ if obj is not None else ():
                if c.__module__.split(".", 1)[0] in ("paddlenlp", "paddleformers"):
                    return c.__module__.split(".", 1)[0]
        return "paddlenlp"

    def _objects(self, trainer, steps_done: int = 0):
        if self._pstate is None:
            module = __import__(f"{self.origin()}.trainer.trainer_callback", fromlist=["TrainerControl"])
            self._pstate, self._control = module.TrainerState(), module.TrainerControl()
        s, p = trainer.state, self._pstate
        p.global_step, p.max_steps, p.num_train_epochs = s.global_step - steps_done, s.max_steps, s.num_train_epochs
        if hasattr(p, "consumed_samples"):  # PaddleFormers': samples of the optimizer steps taken, over all ranks
            a = trainer.args
            p.consumed_samples = p.global_step * a.per_device_train_batch_size * a.gradient_accumulation_steps * \
                trainer.layout.data_world_size
        p.epoch = s.epoch + (s.step_in_epoch / s.steps_per_epoch if s.steps_per_epoch else 0.0)
        p.log_history = list(s.log_history)
        p.best_metric, p.best_model_checkpoint = s.best_metric, s.best_checkpoint
        p.is_world_process_zero = trainer.is_main_process
        p.is_local_process_zero = trainer.is_local_process_zero()
        for theirs, ours in _FLAGS:
            setattr(self._control, theirs, bool(getattr(s, ours)))
        args = self.paddlenlp_args if self.paddlenlp_args is not None else _ArgsView(trainer.args)
        return args, p, self._control

    def call(self, trainer, event: str, steps_done: int = 0, **kwargs) -> None:
        """Call ``event`` on every PaddleNLP callback, then write the control flags back.

        ``steps_done``: optimizer steps this trainer has already counted that PaddleNLP's has not at this hook."""
        if not self.callbacks:  # an adapter kept for PaddleFormers' hf saves alone: nothing to call, no view to build
            return
        args, pstate, control = self._objects(trainer, steps_done)
        if event == "on_log":
            pstate.log_history.append({**kwargs["logs"], "step": trainer.state.global_step})
        if event == "on_evaluate" and self._best_before_eval is not None:
            pstate.best_metric, pstate.best_model_checkpoint = self._best_before_eval
        common = dict(model=trainer.model, tokenizer=getattr(trainer, "tokenizer", None), optimizer=trainer.optimizer,
                      lr_scheduler=trainer.lr_scheduler, train_dataloader=getattr(trainer, "train_dataloader", None),
                      eval_dataloader=getattr(trainer, "eval_dataloader", None))
        for cb in list(self.callbacks):
            result = self.invoke(cb, event, args, pstate, control, **common, **kwargs)
            if result is not None:
                control = self._control = result
        for theirs, ours in _FLAGS:
            setattr(trainer.state, ours, bool(getattr(control, theirs)))
        if getattr(control, "should_epoch_stop", False) and not self._warned_epoch_stop:
            self._warned_epoch_stop = True
            logger.warning("control.should_epoch_stop is not supported: set control.should_training_stop to stop")

    # ---- events ---------------------------------------------------------------------
    def init_end(self, trainer) -> None:
        self.call(trainer, "on_init_end")

    def on_fit_begin(self, trainer):
        self._epoch_open = False
        trainer.state.should_stop = False
        self.call(trainer, "on_train_begin")
        if self.resume_from_custom_func is not None:  # PaddleFormers calls it right after on_train_begin
            self.resume_from_custom_func(trainer.model)

    def on_epoch_begin(self, trainer):
        self._epoch_open = True
        self.call(trainer, "on_epoch_begin")

    def on_step_begin(self, trainer):
        self._save_hf_if_asked(trainer)
        self.call(trainer, "on_step_begin")

    def on_backward_end(self, trainer):
        s = trainer.state
        if s.micro_step < s.num_micro_batches - 1:
            self.call(trainer, "on_substep_end")

    def on_optimizer_step_begin(self, trainer):
        self.call(trainer, "on_optimizer_begin", scaler=trainer.grad_scaler)

    def on_optimizer_step_end(self, trainer):
        # our global_step counts the step before optimizer_step_end; PaddleNLP's after on_optimizer_end
        self.call(trainer, "on_optimizer_end", steps_done=1, scaler=trainer.grad_scaler)

    def on_step_end(self, trainer):
        save_hf = self._save_hf_due(trainer)
        if save_hf:
            self._control.should_save_hf = True  # PaddleFormers' DefaultFlowCallback, first of its handler's
        self._hf_step = save_hf is not None  # looked at once the step's log, evaluation and save are done
        self.call(trainer, "on_step_end")

    def _save_hf_if_asked(self, trainer):
        """PaddleFormers saves for ``should_save_hf`` last in a step, after its log, evaluation and save (their
        hooks fire first): here at the next step's begin, the epoch's end or the run's. The flag stays up until a
        save (a callback may raise it at any hook), as in PaddleFormers."""
        if not self._hf_step:
            return
        self._hf_step = False
        if getattr(self._control, "should_save_hf", False):
            self._control.should_save_hf = False
            if getattr(self.paddlenlp_args, "save_checkpoint_format", "flex_checkpoint") == "flex_checkpoint":
                trainer.save_hf_checkpoint()
                self.call(trainer, "on_save_hf")
                trainer.rotate_hf_checkpoints(getattr(self.paddlenlp_args, "save_hf_total_limit", None))

    def _save_hf_due(self, trainer):
        """PaddleFormers' rule for ``should_save_hf`` at this step (None: not a PaddleFormers run)."""
        if self.origin() != "paddleformers":
            return None
        if self._control is None:
            self._objects(trainer)
        a = self.paddlenlp_args
        steps = int(getattr(a, "save_hf_steps", -1) or -1) if a is not None else -1
        strategy = getattr(getattr(a, "save_strategy", None), "value", getattr(a, "save_strategy", None))
        return bool(strategy == "steps" and steps > 0 and trainer.state.global_step % steps == 0)

    def on_epoch_end(self, trainer):
        self._save_hf_if_asked(trainer)
        self._epoch_open = False
        self.call(trainer, "on_epoch_end")

    def on_eval_step_end(self, trainer):
        self.call(trainer, "on_prediction_step")

    def on_predict_end(self, trainer):
        # predict() has no per-batch events here; PaddleNLP calls on_prediction_step after each batch and nothing
        # else in between, so calling it once per batch at the end gives the same sequence
        try:
            batches = len(trainer.eval_dataloader)
        except TypeError:  # a stream has no length
            batches = 0
        for _ in range(batches):
            self.call(trainer, "on_prediction_step")

    def on_eval_end(self, trainer):
        # PaddleNLP logs an evaluation before on_evaluate, and updates best_metric only when it saves
        self._pending_metrics = dict(trainer.state.metrics)
        self._best_before_eval = (trainer.state.best_metric, trainer.state.best_checkpoint)

    def on_log(self, trainer):
        # their log() hands on_log the record without "step" (it is added to log_history's copy only)
        self.call(trainer, "on_log", logs={k: v for k, v in trainer.state.logs.items() if k != "step"})
        if self._pending_metrics is not None:
            metrics, self._pending_metrics = self._pending_metrics, None
            try:
                self.call(trainer, "on_evaluate", metrics=metrics)
            finally:
                self._best_before_eval = None

    def on_save_end(self, trainer):
        if self.origin() == "paddleformers" and self._logs_at(trainer.state.global_step):
            # PaddleFormers logs a checkpoint saved at a logging step, before on_save
            trainer.log({"step": trainer.state.global_step, "global_save_step": trainer.state.global_step})
        self.call(trainer, "on_save")

    def _logs_at(self, step: int) -> bool:
        """Whether PaddleFormers' DefaultFlowCallback logs at optimizer step ``step``."""
        a = self.paddlenlp_args
        strategy = getattr(getattr(a, "logging_strategy", None), "value", getattr(a, "logging_strategy", None))
        every = int(getattr(a, "logging_steps", 0) or 0)
        return (step == 1 and bool(getattr(a, "logging_first_step", False))) or \
            (strategy == "steps" and every > 0 and step % every == 0)

    def on_fit_end(self, trainer):
        if trainer.state.status == "failed":
            return  # PaddleNLP calls no hook after an error
        self._save_hf_if_asked(trainer)
        if self._epoch_open:  # PaddleNLP ends the epoch it leaves early
            self.on_epoch_end(trainer)
        if getattr(trainer, "_in_train_api", False):
            self._train_end_deferred = True  # train() logs its summary first
        else:
            self.call(trainer, "on_train_end")

    def train_end(self, trainer) -> None:
        """``train()``'s end: ``on_train_end`` after the summary log."""
        if self._train_end_deferred:
            self._train_end_deferred = False
            self.call(trainer, "on_train_end")
