"""The PaddleNLP side of tests/compat/test_event_flow.py: recording ``TrainerCallback``s, the regression
model and data of PaddleNLP's own callback test, and its expected-events rule. Imported by that file's
``nlp`` fixture, so paddlenlp is imported only where those tests run, not wherever the suite is collected."""

import numpy as np
import paddle
from paddlenlp.trainer import EarlyStoppingCallback, IntervalStrategy, PrinterCallback, TrainerCallback  # noqa: F401
from paddlenlp.trainer import Trainer as PaddleNLPTrainer  # noqa: F401
from paddlenlp.trainer import TrainingArguments as PaddleNLPArguments

HOOKS = ("on_init_end", "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_step_begin",
         "on_step_end", "on_evaluate", "on_save", "on_log", "on_prediction_step")
EXTRA_HOOKS = ("on_substep_end", "on_optimizer_begin", "on_optimizer_end")


class Recorder(TrainerCallback):
    """Registers the events that go through (PaddleNLP's MyTestTrainerCallback)."""

    def __init__(self, hooks=HOOKS):
        self.events = []
        for hook in hooks:
            setattr(self, hook, self._make(hook))

    def _make(self, hook):
        def record(args, state, control, **kwargs):
            self.events.append(hook)
        return record


class RegressionDataset(paddle.io.Dataset):
    def __init__(self, length=64, seed=42):
        rng = np.random.RandomState(seed)
        self.x = rng.normal(size=(length,)).astype("float32")
        self.y = (2.0 * self.x + 3.0 + rng.normal(scale=0.1, size=(length,))).astype("float32")

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_x": self.x[i], "labels": self.y[i]}


class RegressionModel(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.a = self.create_parameter([1], default_initializer=paddle.nn.initializer.Constant(0.0))
        self.b = self.create_parameter([1], default_initializer=paddle.nn.initializer.Constant(0.0))

    def forward(self, input_x, labels=None):
        y = input_x * self.a + self.b
        return y if labels is None else (paddle.nn.functional.mse_loss(y, labels), y)


def make(trainer_cls, out, callbacks, **kwargs):
    args = PaddleNLPArguments(str(out), disable_tqdm=True, report_to=[], device="cpu", **kwargs)
    return trainer_cls(model=RegressionModel(), args=args, train_dataset=RegressionDataset(),
                       eval_dataset=RegressionDataset(), callbacks=callbacks)


def expected_events(args, num_train_epochs, train_batches, eval_batches):
    """PaddleNLP's get_expected_events, from the arguments alone."""
    events, step = ["on_init_end", "on_train_begin"], 0
    evaluation = ["on_prediction_step"] * eval_batches + ["on_log", "on_evaluate"]
    for _ in range(num_train_epochs):
        events.append("on_epoch_begin")
        for _ in range(train_batches):
            step += 1
            events += ["on_step_begin", "on_step_end"]
            if step % args.logging_steps == 0:
                events.append("on_log")
            if args.evaluation_strategy == IntervalStrategy.STEPS and step % args.eval_steps == 0:
                events += evaluation
            if step % args.save_steps == 0:
                events.append("on_save")
        events.append("on_epoch_end")
        if args.evaluation_strategy == IntervalStrategy.EPOCH:
            events += evaluation
    return events + ["on_log", "on_train_end"]



class StopAtStep3(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3:
            control.should_training_stop = True
            control.should_save = True
        return control


class EvaluateAtStep2(TrainerCallback):
    def __init__(self):
        self.metrics = None

    def on_step_end(self, args, state, control, **kwargs):
        control.should_evaluate = state.global_step == 2

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.metrics = dict(metrics)



class Broken(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        raise KeyError("boom")



class StateRecorder(TrainerCallback):
    """Records (hook, global_step, epoch) at every hook: the state a PaddleNLP callback reads there."""

    def __init__(self):
        self.seen = []
        for hook in HOOKS + EXTRA_HOOKS:
            setattr(self, hook, self._make(hook))

    def _make(self, hook):
        def record(args, state, control, **kwargs):
            self.seen.append((hook, state.global_step, round(float(state.epoch or 0), 4)))
        return record

