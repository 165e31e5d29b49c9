"""NaNGuard: non-finite losses, gradients and parameters never go unnoticed.

Two actions:

- ``action='stop'`` (the one in the default callback set): training stops with
  a :class:`trainer.errors.TrainingError` (exit code 5) at the first logging
  step (or save) after a step whose loss, gradients or parameters hold nan or
  inf. Nothing is read on the host between logging steps, and between them the
  guard adds no device work of its own: it rides on what the step computes
  anyway. Each step it keeps a reference to the step's loss and, with clipping
  (``max_grad_norm``), to the global gradient norm (finite iff every gradient
  is); under a loss scaler (AMP float16, ``NaNGuard()``) non-finite updates are
  skipped already and only the parameters are checked. At the logging step
  (and before a save, so nan weights are never saved as a checkpoint) one small
  host read looks at those kept values and at one finiteness check of the
  parameters (the sum of each, added up: one read of the weights; a sum that
  is not finite is confirmed element by element before anything stops), and
  the error names the first bad step: "the gradients of step
  N" (the clip norm), "the loss of step N" (on the rank whose loss it was;
  every other rank stops at the same step with "the loss is not finite on a
  rank in steps A-B": at a logging step the logged loss, already reduced
  across ranks, tells every rank; before a save one small collective does,
  as every rank saves together), or, when only the
  parameters show it, the window of steps since the last check ("the
  parameters hold nan or inf at step 10, finite at step 5"). That last case is
  what a nan input behind a ReLU gives without clipping: the loss stays finite
  while the first layer's weights turn nan; the parameter check catches it
  (every paddle optimizer turns a non-finite gradient into non-finite
  weights). What the guard does not do: it does not stop the update of the bad
  step or of the steps up to the check (they are applied; the weights of the
  stopped run are not finite, the last saved checkpoint is). Order 95 (after
  LossSpikeRecovery's rollback, before the loggers). A rollback or a resume
  (``on_load_end``) clears what was kept.
  ``NaNGuard(action='stop', check_gradients=True)`` (what ``NaNGuard(action='stop')``
  means) adds its own pass over the gradients every step (paddle's fused
  ``check_finite_and_unscale`` with scale 1, the gradients unchanged; a device
  flag, no host sync) to name the exact step even without clipping; it costs
  a few kernel launches per step (about 0.1 ms on this project's 2-core CPU,
  10% of the tiny MLP's step in ``benchmarks/overhead``), which is why the
  default set has ``check_gradients=False``. With either, the parameters are
  checked at logging steps.
- ``action='skip'`` (``NaNGuard()``): the rest of this page.

A user's ``NaNGuard`` (any action) replaces the default one; the default one
is also left out when ``LossSpikeRecovery`` is added (it rolls back
non-finite windows itself).

With ``action='skip'``, a non-finite loss or gradient never reaches the parameters.

A step whose loss or gradients hold nan or inf is skipped whole: parameters,
optimizer moments and beta powers stay as they were (paddle's ``found_inf``
skip, the one AMP's loss scaler uses). Skipped steps are counted in
``state.skipped_steps``; after ``max_consecutive`` skipped steps in a row
training stops with a :class:`trainer.errors.TrainingError` that names the step
and what to try.

Events: ``on_fit_begin`` (install the step guard: AMP's loss scaler when
float16 loss scaling is on, else a scale-1 :class:`~callbacks.loss_scaler.DynamicLossScaler`
as ``trainer.grad_scaler``), ``on_optimizer_step_begin`` (hand in the
non-finite-loss flag, a device tensor), ``on_optimizer_step_end`` (update the
consecutive-skip streak on the device), ``on_log`` (fold the count into
``state.skipped_steps``, add ``skipped_steps`` to the training record, stop if
the streak reached ``max_consecutive``), ``on_save_begin`` / ``on_fit_end``
(fold the count).

Options: ``max_consecutive`` (default 10), ``check_gradients`` (default True;
False checks the loss only. With AMP float16 the gradients are always checked:
overflow steps are skipped and, in a row, count toward the streak, so keep
``max_consecutive`` above the few backoffs a fresh loss scale needs).

State saved: none (the count lives in ``TrainerState.skipped_steps``).

Host syncs and where it runs (``action='skip'``): the flags, the count and the streak are device
tensors. Skipping the update costs one host sync per optimizer step, for every
optimizer: paddle 3.3 in dygraph reads the ``found_inf`` flag on the host
inside ``Optimizer.step``. That is why the default callback set has
``NaNGuard(action='stop')``, not this one; with AMP float16 the loss scaler pays that sync already and NaNGuard adds
none. The streak is read at logging intervals, so a run stops at the first
logging step at or after the ``max_consecutive``-th skip in a row: at most
``logging_steps - 1`` further steps run (their updates skipped too when their
values are not finite). Under several processes the loss flag is summed across
ranks (a device collective) so every rank skips the same steps.

    >>> from callbacks import NaNGuard
    >>> NaNGuard(max_consecutive=3).max_consecutive
    3
    >>> NaNGuard(action="stop").order
    95
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import paddle
from paddle import _C_ops

from trainer import distributed as dist
from trainer.errors import ConfigError, TrainingError

from .base import Callback
from .loss_scaler import DynamicLossScaler, unscale_and_check


ACTIONS = ("skip", "stop")
KEEP_MAX = 512  # action='stop': steps kept for the next check; more (logging off) are folded on the device


class NaNGuard(Callback):
    order = 1  # after AMP (0), which installs the loss scaler this guard shares; action='stop': 95 (see below)

    def __init__(self, max_consecutive: int = 10, check_gradients: bool = True, action: str = "skip"):
        if isinstance(max_consecutive, bool) or not isinstance(max_consecutive, int) or max_consecutive < 1:
            raise ConfigError(f"NaNGuard max_consecutive={max_consecutive!r} is not allowed: it must be an integer >= 1")
        if action not in ACTIONS:
            raise ConfigError(f"NaNGuard action={action!r} is not allowed: choose 'skip' (skip non-finite steps, one "
                              "host sync per step) or 'stop' (stop at the next logging step, no sync per step)")
        self.max_consecutive = max_consecutive
        self.check_gradients = bool(check_gradients)
        self.action = action
        if action == "stop":
            # after AMP's unscale (0) and after LossSpikeRecovery's on_log (30), which may roll the weights back;
            # before the loggers (100)
            self.order = 95
        self._params: list = []
        self._first_bad = None
        self._kept: list = []       # action='stop': (step, loss, clip norm) of each step since the last check
        self._folded = False        # kept values were folded into _first_bad / _first_loss since the last check
        self._checked_at = 0        # the step of the last check
        self.scaler: Optional[DynamicLossScaler] = None
        self._owns_scaler = False
        self._reset_counters()

    def _reset_counters(self) -> None:
        self._streak = paddle.zeros([], dtype="int64")      # skipped steps in a row, now
        self._tripped_at = paddle.full([], -1, dtype="int64")  # index in the window where the streak hit the limit
        self._window = paddle.zeros([], dtype="int64")      # optimizer steps since the last check

    # ---- events -----------------------------------------------------------------
    def on_fit_begin(self, trainer):
        if self.action == "stop":
            self._params = None  # taken at the first step: fit() lays the model out after on_fit_begin
            self._first_bad = paddle.full([], -1, dtype="int64")
            self._first_loss = paddle.full([], -1, dtype="int64")
            self._folded = False
            self._one = paddle.ones([], dtype="float32")
            self._kept, self._checked_at = [], trainer.state.global_step
            return
        current = trainer.grad_scaler
        if current is None:
            params = [p for p in trainer.model.parameters() if not p.stop_gradient]
            self.scaler = DynamicLossScaler(init_loss_scaling=1.0, use_dynamic_loss_scaling=False,
                                            parameters=params, check_gradients=self.check_gradients)
            trainer.grad_scaler = self.scaler
            self._owns_scaler = True
        elif isinstance(current, DynamicLossScaler):
            self.scaler, self._owns_scaler = current, False
        else:
            raise ConfigError(f"NaNGuard cannot guard steps through a {type(current).__name__} in trainer.grad_scaler: "
                              "use callbacks.AMP for loss scaling, or remove NaNGuard")
        self._reset_counters()

    def wants(self, hook: str) -> bool:
        # action='stop' without its own gradient pass has nothing to do before the update
        return not (hook == "on_optimizer_step_begin" and self.action == "stop" and not self.check_gradients)

    def on_optimizer_step_begin(self, trainer):
        if self.action == "stop":
            if self.check_gradients:  # (paddle.no_grad() as a decorator costs ~50 us a call: not on every step)
                self._note_gradients(trainer)
            return
        if not self._guarding(trainer):
            return
        loss = trainer.state.step_loss
        if loss is None and trainer.world_size == 1:
            return
        # a rank without the loss (a pipeline stage before the last) still joins the agreement
        flag = paddle.zeros([], dtype="bool") if loss is None else paddle.logical_not(paddle.isfinite(loss).all())
        if trainer.world_size > 1:  # the same decision on every rank, without a host sync
            flag = dist.all_reduce_sum(flag.astype("int32")) > 0
        self.scaler.skip_if(flag)

    def on_optimizer_step_end(self, trainer):
        if self.action == "stop":
            self._keep(trainer)
            return
        if not self._guarding(trainer):
            return
        if self.scaler.stage != "ready":
            self.scaler.discard_step()  # the trainer skipped this update on a host flag
        found = self.scaler.last_found_inf.astype("int64")
        self._streak = (self._streak + 1) * found
        hit = paddle.logical_and(self._streak >= self.max_consecutive, self._tripped_at < 0)
        self._tripped_at = paddle.where(hit, self._window, self._tripped_at)
        self._window = self._window + 1

    def on_log(self, trainer):
        if self.action == "stop":
            logs = trainer.state.logs
            if "loss" in logs:  # training records: the step's one host sync happens here anyway
                # the logged loss is the mean over steps and ranks of the step losses (reduced across ranks by the
                # log itself): finite, so is each of them, on every rank (no device op, no collective of ours)
                losses_finite = isinstance(logs["loss"], float) and math.isfinite(logs["loss"])
                guarded = trainer.grad_scaler is None  # (a loss scaler's overflow steps are skipped, not errors)
                self._stop_if_not_finite(trainer, "checked at logging step", losses_finite,
                                         elsewhere=None if losses_finite or not guarded else True)
            return
        if not self._guarding(trainer):
            return
        self._fold_skipped(trainer)
        state = trainer.state
        # one host read at a logging interval: where the streak hit the limit, and the window length
        tripped_at, window = (int(v) for v in paddle.stack([self._tripped_at, self._window]).numpy())
        self._tripped_at = paddle.full([], -1, dtype="int64")
        self._window = paddle.zeros([], dtype="int64")
        if "loss" in state.logs:
            state.logs["skipped_steps"] = state.skipped_steps
        if tripped_at >= 0:
            step = state.global_step - window + tripped_at + 1
            raise TrainingError(
                f"NaNGuard: {self.max_consecutive} optimizer steps in a row had a non-finite loss or gradient, the last "
                f"of them step {step} (checked at step {state.global_step}); their updates were skipped and training "
                "stopped: lower learning_rate, enable clipping with max_grad_norm (e.g. 1.0), check the data for nan/inf"
                + (", or use amp bf16 instead of fp16" if not self._owns_scaler else ""))

    def on_save_begin(self, trainer):
        if self.action == "stop":  # never save nan weights as a checkpoint
            # several ranks: whether any rank kept a non-finite loss since the last check, one small collective per
            # save (every rank saves together), so that every rank stops, or saves, alike
            several = trainer.world_size > 1 and self._first_bad is not None and trainer.grad_scaler is None
            elsewhere = self._bad_losses_anywhere() if several else None
            self._stop_if_not_finite(trainer, "checked before saving step", elsewhere=elsewhere)
            return
        if self._guarding(trainer):
            self._fold_skipped(trainer)

    def on_load_end(self, trainer):
        if self.action == "stop" and self._first_bad is not None:  # a rollback (LossSpikeRecovery) or a resume
            self._first_bad = paddle.full([], -1, dtype="int64")
            self._first_loss = paddle.full([], -1, dtype="int64")
            self._kept, self._checked_at, self._folded = [], trainer.state.global_step, False

    # ---- action='stop': a device flag per step, read where the host syncs anyway ------
    @paddle.no_grad()
    def _note_gradients(self, trainer) -> None:
        if not self.check_gradients or trainer.grad_scaler is not None or self._first_bad is None:
            return  # a loss scaler (AMP fp16, NaNGuard 'skip') already skips non-finite updates
        grads = [p.grad for p in self._held(trainer) if p.grad is not None]
        if not grads:
            return
        bad = unscale_and_check(grads, self._one)  # paddle's fused check (gradients divided by 1: unchanged)
        step = paddle.full([], trainer.state.global_step + 1, dtype="int64")
        self._first_bad = paddle.where(paddle.logical_and(bad, self._first_bad < 0), step, self._first_bad)

    def _keep(self, trainer) -> None:
        """References to what the step computed anyway (no device op): its loss and, with clipping, the norm."""
        if self._first_bad is None or trainer.grad_scaler is not None:
            return  # a loss scaler skips non-finite updates (and overflow steps are normal under float16)
        state = trainer.state
        loss = state.step_loss  # each rank's own; the checks make every rank decide alike (see _stop_if_not_finite)
        norm = state.grad_norm if trainer.args.max_grad_norm is not None else None
        if loss is not None or norm is not None:
            self._kept.append((state.global_step, loss, norm))
            if len(self._kept) >= KEEP_MAX:  # no check for that long (logging off): fold on the device
                self._fold_kept()

    def _held(self, trainer) -> list:
        if self._params is None:
            self._params = trainer.layout.held_parameters(trainer.model)
        return self._params

    def _param_flags(self, trainer, exact: bool = False) -> list:
        """0-d finiteness flags of the parameters this rank holds (``trainer.layout``); one flag agreed over the
        ranks that each hold a part of them (stage 3, tensor and pipeline parallel), so every rank decides the same.

        Fast (the check at every logging step): one flag, whether the sum of every parameter is finite. A nan or
        inf element makes its parameter's sum nan or inf, so a finite sum clears them all in one read of the
        weights (a third of ``isfinite`` + ``all`` per parameter: 6 ms against 19 on ResNet-50's 23.6 M on this
        project's CPU, once per logging step). A non-finite sum can also be finite weights whose sum leaves
        float32's range; ``exact=True`` (asked then only: every rank of a split model, since the fast flag is
        agreed over the group) decides with one ``isfinite`` per parameter."""
        # asked at every check: under stage 3 the slices a rank holds are new tensors after every step
        held = trainer.layout.held_parameters(trainer.model)
        if not held:
            return []
        if exact:
            flags = [_C_ops.all(_C_ops.isfinite(p), [], False) for p in held]
        else:  # other dtypes summed in float32 (float16 overflows on sums of ordinary weights; one dtype for add_n)
            sums = [_C_ops.sum(p, [], None if p.dtype == paddle.float32 else paddle.float32, False) for p in held]
            flags = [_C_ops.isfinite(sums[0] if len(sums) == 1 else _C_ops.add_n(sums))]
        group = trainer.layout.parameter_group
        if not trainer.layout.splits_parameters or not flags:
            return flags
        bad = paddle.logical_not(_C_ops.stack(flags, 0).all()).astype("int32")
        paddle.distributed.all_reduce(bad, group=group)  # a collective at logging steps only
        return [bad == 0]

    @paddle.no_grad()
    def _fold_kept(self) -> None:
        """The first non-finite kept loss and clip norm into two device scalars (device ops, no host read)."""
        kept, self._kept = self._kept, []
        for slot, at in (("_first_bad", 2), ("_first_loss", 1)):
            items = [(k[0], k[at]) for k in kept if k[at] is not None]
            if not items:
                continue
            values = paddle.stack([t.astype("float32").reshape([-1]).sum() for _, t in items])
            bad = paddle.logical_not(paddle.isfinite(values))
            steps = paddle.to_tensor([s for s, _ in items], dtype="int64")
            first = paddle.where(bad.any(), steps[paddle.argmax(bad.astype("int32"))], paddle.full([], -1, "int64"))
            current = getattr(self, slot)
            setattr(self, slot, paddle.where(current >= 0, current, first))
        self._folded = True

    @paddle.no_grad()
    def _bad_losses_anywhere(self) -> paddle.Tensor:
        """The number of ranks that kept a non-finite loss since the last check (a device scalar, summed across
        ranks; no host read)."""
        losses = [loss.astype("float32").reshape([-1]).sum() for _, loss, _ in self._kept if loss is not None]
        bad = (paddle.logical_not(paddle.isfinite(paddle.stack(losses))).any() if losses else
               paddle.zeros([], dtype="bool"))
        if self._folded:
            bad = paddle.logical_or(bad, self._first_loss >= 0)
        return dist.all_reduce_sum(bad.astype("int32"))

    def _stop_if_not_finite(self, trainer, when: str, losses_finite: bool = False, elsewhere=None) -> None:
        """Stop when a kept loss or norm, the first bad step noted on the device, or the parameters are not finite.

        ``elsewhere``: whether some rank's loss was not finite: True (the logged loss, reduced across ranks, is
        not), or a device count of such ranks (before a save), read with the rest; each rank's kept losses are its
        own, so a rank whose losses are finite names the window instead of the step.
        """
        if self._first_bad is None:
            return
        kept, self._kept = self._kept, []
        since, self._checked_at = self._checked_at, trainer.state.global_step
        tensors = [(i, kind, t) for i, (_, loss, norm) in enumerate(kept)
                   for kind, t in (("loss", None if losses_finite else loss), ("gradients", norm)) if t is not None]
        folded, self._folded = self._folded, False
        head = self.check_gradients or folded  # the first bad step noted on the device: read it too
        # 0-d flags stacked once; paddle's ops are called directly (its Python wrappers cost ~40 us a log)
        scalars = [self._first_bad < 0] if head else []
        param_flags = self._param_flags(trainer)
        scalars.extend(param_flags)
        if folded:
            scalars.append(self._first_loss < 0)
        remote = isinstance(elsewhere, paddle.Tensor)
        if remote:
            scalars.append(elsewhere == 0)
        parts = [_C_ops.stack(scalars, 0)] if scalars else []
        order = []  # the kept tensors, grouped by dtype and shape: one finiteness op per group
        groups: dict = {}
        for j, (_, _, t) in enumerate(tensors):
            groups.setdefault((t.dtype, tuple(t.shape)), []).append(j)
        for idx in groups.values():
            group = [tensors[j][2] for j in idx]
            parts.append(paddle.isfinite(paddle.stack(group)).reshape([len(idx), -1]).all(axis=1))
            order.extend(idx)
        # the one host read
        flags = (parts[0] if len(parts) == 1 else _C_ops.concat(parts, 0)).numpy() if parts else np.ones(0, bool)
        at = int(head)
        first = int(self._first_bad.numpy()) if head and not flags[0] else -1
        params = not flags[at:at + len(param_flags)].all()
        if params:  # the fast check's sum left float32's range, or an element is not finite: decide exactly
            params = not _C_ops.stack(self._param_flags(trainer, exact=True), 0).all().numpy()
        at += len(param_flags)
        folded_loss = int(self._first_loss.numpy()) if folded and not flags[at] else -1  # (a failing check only)
        loss_elsewhere = (not flags[at + int(folded)]) if remote else elsewhere is True
        rest = flags[at + int(folded) + int(remote):]
        bad_kept = sorted(order[k] for k, good in enumerate(rest) if not good)
        if folded:
            self._first_loss = paddle.full([], -1, dtype="int64")
            if not self.check_gradients and first < 0:
                self._first_bad = paddle.full([], -1, dtype="int64")
        what = None
        if first >= 0 and not (0 <= folded_loss < first):
            what = f"the gradients of step {first} hold nan or inf"
        elif folded_loss >= 0:
            first = folded_loss
            what = f"the loss of step {first} is not finite"
        else:
            bad = [tensors[j] for j in bad_kept]
            if bad:
                i, kind, _ = min(bad, key=lambda b: (b[0], b[1] != "gradients"))  # the earliest; its gradients first
                first = kept[i][0]
                what = (f"the gradients of step {first} hold nan or inf" if kind == "gradients" else
                        f"the loss of step {first} is not finite")
        step = trainer.state.global_step
        if what is None and loss_elsewhere:  # another rank's loss (its own message names the step)
            what = (f"the loss is not finite on {'a rank' if trainer.world_size > 1 else 'this process'} in "
                    + (f"steps {since + 1}-{step}" if step - since > 1 else f"step {step}"))
        if what is None and not params:
            return
        if what is None:
            what = f"the parameters hold nan or inf at step {step}"
            where = (f"an update of steps {since + 1}-{step}" if step - since > 1 else f"the update of step {step}")
            detail = (f" ({when} {step}; they were finite at step {since}: {where} made them so, NaNGuard(action='stop', "
                      "check_gradients=True) or max_grad_norm would name the step)")
        else:
            what += ", and the parameters are no longer finite" if params else ""
            detail = f" ({when} {step})"
        data_steps = (f"step {first}" if first >= 0 else
                      f"steps {since + 1}-{step}" if step - since > 1 else f"step {step}")
        raise TrainingError(
            f"NaNGuard: {what}{detail}; training stopped: check the data of {data_steps} "
            "for nan/inf, lower learning_rate, clip with max_grad_norm, or add callbacks.NaNGuard() to skip such steps")

    def on_fit_end(self, trainer):
        if self._guarding(trainer) and self._owns_scaler:
            self._fold_skipped(trainer)
            trainer.grad_scaler = None  # a later fit() installs it again

    # ---- helpers --------------------------------------------------------------------
    def _guarding(self, trainer) -> bool:
        return self.scaler is not None and trainer.grad_scaler is self.scaler

    def _fold_skipped(self, trainer) -> None:
        """The owner of the scaler folds its skip count into the state (AMP does when it owns it)."""
        if self._owns_scaler:
            trainer.state.skipped_steps += self.scaler.take_skipped()

    def __repr__(self) -> str:
        return (f"NaNGuard(max_consecutive={self.max_consecutive}, check_gradients={self.check_gradients}, "
                f"action={self.action!r}, order={self.order})")

