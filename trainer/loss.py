"""The training loss: read from the model's outputs, checked, backpropagated, and summed over a logging window.

Reading (``Trainer.compute_loss``, ``training_step`` and ``evaluation_step`` delegate here): :func:`forward`
runs the model on a batch and finds its labels (a mapping's ``labels`` key, or ``label_names``; a
sequence's last item); :func:`loss_of` applies ``loss_fn`` to the outputs, or :func:`loss_from_outputs`
finds the loss the model returned; :func:`eval_loss` is evaluation's loss and outputs, and
:func:`micro_batch_share` the part of a step's loss one micro-batch backpropagates. A bad batch gets one line naming the sample and the fix
(``trainer.data.batch_errors``: labels outside the classes, float class labels), never paddle's kernel
error; :func:`check_loss` refuses a loss that is not a scalar tensor.

Summing (:class:`LossWindow`): the training loss since the last log record, each step's loss kept as a
device tensor and summed in step order, a few dozen steps at a time (one ``add_n`` instead of an add per
step). The sum is bitwise the one of adding the steps one by one (``add_n`` adds its inputs in order), so
a run resumed inside a logging window (the window's sum travels in the checkpoint) logs the same
mean loss as the uninterrupted run. No host sync: the trainer reads the mean at a logging step.

    >>> import paddle
    >>> loss_from_outputs({"loss": paddle.to_tensor(0.5), "logits": paddle.ones([2, 3])}).item()
    0.5
    >>> check_loss(paddle.ones([2]))
    Traceback (most recent call last):
    trainer.errors.TrainingError: compute_loss returned a tensor of shape [2], not a scalar: reduce it (e.g. loss.mean())
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import paddle

from .data.batch import labels_of
from .data.batch_errors import backward_dtype_error, label_dtype_error, label_error
from .errors import DataError, TrainingError


class LossWindow:
    #: step losses kept before they are folded into the sum (bounds memory when logging is off)
    FOLD = 64

    def __init__(self, total: Optional[float] = None, steps: int = 0):
        self.reset(total, steps)

    def reset(self, total: Optional[float] = None, steps: int = 0) -> None:
        """Empty, or holding a window restored from a checkpoint (its sum and number of steps)."""
        # None: nothing summed yet (adding 0 first would not change the sum; allocating it costs ~20 us a log)
        self._sum = None if total is None else paddle.to_tensor(total, dtype="float32")
        self._pending: list[paddle.Tensor] = []
        self.steps = steps

    def add(self, step_loss: Optional[paddle.Tensor]) -> None:
        """One step's loss; None for a step whose loss another rank holds (a pipeline stage before the last: the
        window's mean is then the last stage's, shared at the logging step)."""
        if step_loss is not None:
            self._pending.append(step_loss)
        self.steps += 1
        if len(self._pending) >= self.FOLD:
            self._fold()

    def total(self) -> paddle.Tensor:
        """The sum of the window's step losses, a float32 device scalar."""
        self._fold()
        return paddle.zeros([], dtype="float32") if self._sum is None else self._sum

    def _fold(self) -> None:
        if not self._pending:
            return
        parts = [t if t.dtype == paddle.float32 else t.astype("float32") for t in self._pending]
        parts = [t if not t.shape else t.reshape([]) for t in parts]
        self._pending = []
        self._sum = paddle.add_n(parts if self._sum is None else [self._sum] + parts)


def forward(model, batch, label_names: Optional[Sequence[str]], loss_fn: Optional[Callable]):
    """Run the model on a batch; return (outputs, labels or None)."""
    if isinstance(batch, Mapping):  # dict, paddlenlp BatchEncoding, ...: keyword arguments
        keys = label_names or ["labels"]
        labels = labels_of(batch, keys)
        if loss_fn is not None and labels is not None:
            return model(**{k: v for k, v in batch.items() if k not in keys}), labels
        return model(**batch), labels
    if isinstance(batch, (list, tuple)):
        if len(batch) == 1:
            return model(batch[0]), None
        return model(*batch[:-1]), batch[-1]
    return model(batch), None


def loss_of(loss_fn: Callable, outputs, labels, batch_indices: Callable[[], Optional[Sequence[int]]]) -> paddle.Tensor:
    """``loss_fn(outputs, labels)``; missing labels, float class labels and labels outside the classes are a
    :class:`DataError` naming the batch's samples (``batch_indices()``, asked only then: None outside training)."""
    if labels is None:
        raise DataError("loss_fn is set but the batch has no labels: give (inputs, labels) batches or a 'labels' key")
    dtype_error = label_dtype_error(loss_fn, labels)
    if dtype_error is not None:
        raise dtype_error
    try:
        return loss_fn(outputs, labels)
    except Exception as exc:  # labels outside the classes: name the sample, not paddle's kernel
        error = label_error(outputs, labels, batch_indices())
        if error is None:
            raise
        raise error from exc


def loss_from_outputs(outputs: Any, required: bool = True):
    """The loss a model returned: a scalar tensor, a dict's or an object's ``loss``, a tuple's scalar first item.
    None when there is none and it is not ``required`` (evaluation); else a :class:`TrainingError`."""
    if isinstance(outputs, paddle.Tensor):
        return outputs if outputs.size == 1 or required else None
    if isinstance(outputs, dict) and "loss" in outputs:
        return outputs["loss"]
    if getattr(outputs, "loss", None) is not None:
        return outputs.loss
    if isinstance(outputs, (list, tuple)) and outputs and isinstance(outputs[0], paddle.Tensor) and outputs[0].size == 1:
        return outputs[0]
    if not required:
        return None
    raise TrainingError("the model's output holds no loss and no loss_fn was given: "
                        "pass Trainer(loss_fn=...) or return the loss from the model")


def eval_loss(compute_loss: Callable, model, batch, labels, label_names: Optional[Sequence[str]],
              loss_fn: Optional[Callable]):
    """Evaluation's ``(loss or None, outputs)`` of a batch: ``compute_loss``'s loss, the one training minimizes, with
    ``return_outputs=True`` (an override written without it: its loss, then the model run again for the outputs);
    unlabelled data (``labels`` None) with a ``loss_fn``: the outputs, and a loss only when the model returned one."""
    if labels is None and loss_fn is not None:
        outputs, _ = forward(model, batch, label_names, loss_fn)
        return loss_from_outputs(outputs, required=False), outputs
    if accepts_return_outputs(compute_loss):
        return compute_loss(model, batch, return_outputs=True)
    loss = compute_loss(model, batch)
    return loss, forward(model, batch, label_names, loss_fn)[0]


def check_loss(loss: Any) -> None:
    """A scalar ``paddle.Tensor``, or a :class:`TrainingError` saying what ``compute_loss`` returned instead."""
    if not isinstance(loss, paddle.Tensor):
        raise TrainingError(f"compute_loss returned {type(loss).__name__}, not a paddle.Tensor: return the loss tensor")
    if math.prod(loss.shape) != 1:  # from the shape: Tensor.size is a paddle call, and this runs every step
        raise TrainingError(f"compute_loss returned a tensor of shape {list(loss.shape)}, not a scalar: "
                            "reduce it (e.g. loss.mean())")


def micro_batch_share(loss: paddle.Tensor, share: float, n: int) -> paddle.Tensor:
    """The micro-batch's part of its step's loss, the one backward runs on: ``1/n`` of it over ``n`` micro-batches,
    weighted by its ``share`` of a data batch that ``auto_find_batch_size`` cut (``trainer.auto_batch``)."""
    if share != 1.0:
        return loss * (share / n)
    return loss / n if n > 1 else loss


def backward(loss: paddle.Tensor, batch, label_names: Optional[Sequence[str]]) -> None:
    """``loss.backward()``; a loss inside the model given float class labels raises a one-line DataError."""
    try:
        loss.backward()
    except (OSError, RuntimeError) as exc:
        labels = labels_of(batch, label_names or ["labels"]) if isinstance(batch, Mapping) else \
            (batch[-1] if isinstance(batch, (list, tuple)) else None)
        error = backward_dtype_error(exc, labels)
        if error is None:
            raise
        raise error from None


def accepts_return_outputs(compute_loss: Callable) -> bool:
    """Whether a ``compute_loss`` (an override may predate it) takes ``return_outputs``."""
    try:
        params = inspect.signature(compute_loss).parameters
    except (TypeError, ValueError):
        return False
    return "return_outputs" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
