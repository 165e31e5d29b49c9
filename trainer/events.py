"""The lifecycle events, in one table.

A callback handles event ``X`` by defining ``on_X(self, trainer)``. Events come
as ``<scope>_begin`` / ``<scope>_end`` pairs plus the point events ``log`` and
``exception``. They fire on every rank, in callback ``order``.
"""

from __future__ import annotations

import enum


class Event(str, enum.Enum):
    FIT_BEGIN = "fit_begin"
    EPOCH_BEGIN = "epoch_begin"
    STEP_BEGIN = "step_begin"
    BACKWARD_BEGIN = "backward_begin"
    BACKWARD_END = "backward_end"
    OPTIMIZER_STEP_BEGIN = "optimizer_step_begin"
    OPTIMIZER_STEP_END = "optimizer_step_end"
    STEP_END = "step_end"
    LOG = "log"
    EPOCH_END = "epoch_end"
    EVAL_BEGIN = "eval_begin"
    EVAL_STEP_BEGIN = "eval_step_begin"
    EVAL_STEP_END = "eval_step_end"
    EVAL_END = "eval_end"
    PREDICT_BEGIN = "predict_begin"
    PREDICT_END = "predict_end"
    SAVE_BEGIN = "save_begin"
    SAVE_END = "save_end"
    LOAD_BEGIN = "load_begin"
    LOAD_END = "load_end"
    EXCEPTION = "exception"
    FIT_END = "fit_end"

    @property
    def method(self) -> str:
        return "on_" + self.value


# event -> (when it fires, what a callback may change)
EVENT_TABLE = {
    Event.FIT_BEGIN: ("fit() starts: optimizer and scheduler built, resume applied, seeds set; DataParallel wraps the model right after",
                      "trainer.optimizer, trainer.lr_scheduler, trainer.model (e.g. AMP O2 decoration), state.max_steps"),
    Event.EPOCH_BEGIN: ("before the first batch of an epoch; the sampler already has set_epoch(epoch)", "state.should_stop"),
    Event.STEP_BEGIN: ("before the first micro-batch of an optimizer step", "state.should_stop"),
    Event.BACKWARD_BEGIN: ("after compute_loss, before backward, once per micro-batch",
                           "state.loss (the tensor backward runs on: AMP scales it)"),
    Event.BACKWARD_END: ("after backward, once per micro-batch", "gradients"),
    Event.OPTIMIZER_STEP_BEGIN: ("all micro-batches done, before clipping and the update",
                                 "gradients (AMP unscales), state.skip_optimizer_step"),
    Event.OPTIMIZER_STEP_END: ("after update (or skip), scheduler step, clear_grad and global_step += 1", "-"),
    Event.STEP_END: ("after the optimizer step", "state.should_log, should_evaluate, should_save, should_stop"),
    Event.LOG: ("at logging intervals and after evaluation, once values are reduced across ranks",
                "state.logs (add figures before the logger, order < 100, writes them)"),
    Event.EPOCH_END: ("after the last step of an epoch", "state.should_evaluate, should_save, should_stop"),
    Event.EVAL_BEGIN: ("evaluate() starts, before the model is put in eval mode", "-"),
    Event.EVAL_STEP_BEGIN: ("before each evaluation batch", "-"),
    Event.EVAL_STEP_END: ("after each evaluation batch", "-"),
    Event.EVAL_END: ("metrics computed and reduced across ranks, in state.metrics", "state.metrics, state.should_stop"),
    Event.PREDICT_BEGIN: ("predict() starts", "-"),
    Event.PREDICT_END: ("predictions gathered across ranks", "-"),
    Event.SAVE_BEGIN: ("save_checkpoint() starts, on every rank", "-"),
    Event.SAVE_END: ("checkpoint complete and published", "-"),
    Event.LOAD_BEGIN: ("load_checkpoint() starts", "-"),
    Event.LOAD_END: ("checkpoint restored (model, optimizer, state, callbacks)", "-"),
    Event.EXCEPTION: ("something raised inside fit(); state.error holds it", "-"),
    Event.FIT_END: ("always, last; state.status is completed, stopped (should_stop before max_steps), preempted (a signal, callbacks.Preemption) or failed", "-"),
}


def event_table_markdown() -> str:
    """The table above as Markdown (docs/reference/events.md embeds it)."""
    rows = ["| event | fires | a callback may change |", "|---|---|---|"]
    for event, (when, mutable) in EVENT_TABLE.items():
        rows.append(f"| `on_{event.value}` | {when} | {mutable} |")
    return "\n".join(rows)
