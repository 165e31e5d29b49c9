"""TrainerState: everything a callback may read or change during a run.

It is a dataclass that serialises to JSON (``state_dict`` / ``load_state_dict``):
counters, the last metrics and log record, and the control flags. Tensors
(``loss``, ``step_loss``, ``grad_norm``) stay on the device and are never
serialised.

Control flags and when they reset:

=====================  ==========================================================
flag                   meaning, and when the trainer clears it
=====================  ==========================================================
should_stop            leave the loop after the current step (or before the next
                       epoch). Never cleared during fit(); fit() clears it at start.
should_log             reduce and log the loss after ``on_step_end``; cleared then.
should_evaluate        run evaluate() after the step (after logging); cleared then.
should_save            save a checkpoint after the step (after evaluation);
                       cleared then.
skip_optimizer_step    skip this optimizer update (gradients are still cleared);
                       set in ``on_optimizer_step_begin``, cleared after the step.
=====================  ==========================================================

Flags that start collectives (log, evaluate, save) must be set identically on
every rank: derive them from ``global_step`` or from metrics already reduced
across ranks, never from a rank-local value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

# never saved: device tensors, the error, and the control flags (a resumed run starts with clear flags)
_RUNTIME_ONLY = ("loss", "step_loss", "grad_norm", "error", "exit_code", "status", "should_stop", "should_log",
                 "should_evaluate", "should_save", "skip_optimizer_step", "train_metrics")


@dataclass
class TrainerState:
    # progress
    global_step: int = 0          # optimizer steps done (skipped steps count too)
    epoch: int = 0                # current epoch, 0-based
    step_in_epoch: int = 0        # optimizer steps done in the current epoch
    micro_step: int = 0           # index of the current micro-batch in the step
    num_micro_batches: int = 1    # micro-batches in the current optimizer step
    max_steps: int = 0            # total optimizer steps of this fit()
    steps_per_epoch: int = 0
    num_train_epochs: int = 0
    samples_seen: int = 0         # training samples consumed, summed over ranks
    tokens_seen: int = 0          # input_ids elements consumed (padding included), summed over ranks
    world_size: int = 1
    global_batch_size: int = 0    # per-device batch x accumulation x world size
    train_micro_batch_size: int = 0  # samples per forward when auto_find_batch_size cut the data batches after an
                                     # out-of-memory (0: the whole per-device batch); kept in checkpoints
    skipped_steps: int = 0        # optimizer updates skipped (AMP overflow, NaN guard, callbacks)
    run_id: str = ""              # the run the checkpoints belong to (kept on resume; see trainer.checkpoint.output_dir)
    # timing (host clocks; no device sync)
    data_wait_time: float = 0.0   # seconds spent waiting for batches, this fit()
    last_data_wait: float = 0.0   # seconds waited for the batches of the current step
    last_step_time: float = 0.0   # host seconds of the last step, data wait included
    # results
    metrics: dict = field(default_factory=dict)     # last evaluation metrics
    train_metrics: dict = field(default_factory=dict)  # this fit(): train_runtime, train_samples_per_second, train_steps_per_second
    logs: dict = field(default_factory=dict)        # the record being logged (mutable in on_log)
    log_history: list = field(default_factory=list)
    best_metric: Optional[float] = None
    best_checkpoint: Optional[str] = None
    last_checkpoint: Optional[str] = None
    status: str = "idle"          # idle | running | completed | stopped | preempted | failed
    # control flags (see the module docstring for reset points)
    should_stop: bool = False
    should_log: bool = False
    should_evaluate: bool = False
    should_save: bool = False
    skip_optimizer_step: bool = False
    # runtime only: tensors on the device, the error of a failed run
    loss: Any = None              # the loss that backward runs on (mutable in on_backward_begin)
    step_loss: Any = None         # mean unscaled loss of the last optimizer step (detached); None under pipeline parallel on the stages that do not compute the loss (all but the last)
    grad_norm: Any = None         # global gradient norm before clipping, when clipping is on
    error: Optional[BaseException] = None
    exit_code: int = 0            # the process exit code asked for by a callback that stopped the run
                                  # (callbacks.Preemption: 128 + the signal); ptrain run exits with it

    def state_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            if f.name not in _RUNTIME_ONLY:
                out[f.name] = getattr(self, f.name)
        return _jsonable(out)

    def load_state_dict(self, state: dict) -> None:
        names = {f.name for f in dataclasses.fields(self)} - set(_RUNTIME_ONLY)
        for key, value in state.items():
            if key in names:
                setattr(self, key, value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):  # numpy scalar
        return value.item()
    return str(value)
