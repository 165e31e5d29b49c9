"""The training loss since the last log record: each step's loss kept as a device tensor and summed
in step order, a few dozen steps at a time (one ``add_n`` instead of an add per step).

The sum is bitwise the one of adding the steps one by one (``add_n`` adds its inputs in order), so
a run resumed inside a logging window (the window's sum travels in the checkpoint) logs the same
mean loss as the uninterrupted run. No host sync: the trainer reads the mean at a logging step.
"""

from __future__ import annotations

from typing import List, Optional

import paddle


class LossWindow:
    #: step losses kept before they are folded into the sum (bounds memory when logging is off)
    FOLD = 64

    def __init__(self, total: Optional[float] = None, steps: int = 0):
        self.reset(total, steps)

    def reset(self, total: Optional[float] = None, steps: int = 0) -> None:
        """Empty, or holding a window restored from a checkpoint (its sum and number of steps)."""
        # None: nothing summed yet (adding 0 first would not change the sum; allocating it costs ~20 us a log)
        self._sum = None if total is None else paddle.to_tensor(total, dtype="float32")
        self._pending: List[paddle.Tensor] = []
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
