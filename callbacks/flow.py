"""FlowControl: turns the logging, evaluation and saving intervals of
``TrainingArguments`` into the state flags the trainer acts on.

Events: ``on_step_end``, ``on_epoch_end``, ``on_eval_end``, ``on_save_end``.
Options: read from ``trainer.args`` (logging_strategy, logging_steps,
logging_first_step, evaluation_strategy, eval_steps, save_strategy,
save_steps, flush_at_end). State saved: none.

With ``flush_at_end`` (the default) the last step of a run always logs, and
evaluates and saves when the strategy is not ``no``, so a finished run has
final metrics and a final checkpoint (an ``epoch`` strategy whose epoch ends
at that step evaluates and saves in ``on_epoch_end``, after the epoch has
ended, as PaddleNLP and ``paddle.Model.fit`` do); with ``flush_at_end=False`` the last
step is like any other, as in PaddleNLP's ``DefaultFlowCallback``. Replace it
with your own subclass to change the policy.
"""

from __future__ import annotations

from .base import Callback


class FlowControl(Callback):
    order = 20

    def __init__(self):
        self._last_eval_step = -1
        self._last_save_step = -1

    def on_step_end(self, trainer):
        s, a = trainer.state, trainer.args
        step, last = s.global_step, s.global_step >= s.max_steps and a.flush_at_end
        if (a.logging_strategy == "steps" and step % a.logging_steps == 0) or last or (step == 1 and a.logging_first_step):
            s.should_log = True
        if a.evaluation_strategy == "steps" and step % a.eval_steps == 0:
            s.should_evaluate = True
        if a.save_strategy == "steps" and step % a.save_steps == 0:
            s.should_save = True
        if last:  # an epoch strategy whose epoch ends here acts in on_epoch_end, after the epoch's end
            epoch_ends = s.step_in_epoch >= s.steps_per_epoch
            s.should_evaluate |= a.evaluation_strategy == "steps" or (a.evaluation_strategy == "epoch" and not epoch_ends)
            s.should_save |= a.save_strategy == "steps" or (a.save_strategy == "epoch" and not epoch_ends)

    def on_epoch_end(self, trainer):
        s, a = trainer.state, trainer.args
        if a.logging_strategy == "epoch":
            s.should_log = True
        if a.evaluation_strategy == "epoch" and self._last_eval_step != s.global_step:
            s.should_evaluate = True
        if a.save_strategy == "epoch" and self._last_save_step != s.global_step:
            s.should_save = True

    def on_eval_end(self, trainer):
        self._last_eval_step = trainer.state.global_step

    def on_save_end(self, trainer):
        self._last_save_step = trainer.state.global_step
