"""Count device-to-host syncs during training steps.

Every way paddle copies a tensor to the host from Python goes through one of
the ``paddle.Tensor`` methods patched here (``numpy``, ``__array__``, ``item``,
``tolist``, ``__float__``, ``__int__``, ``__index__``, ``__bool__``,
``__nonzero__``); nested calls (``__bool__`` -> ``__nonzero__`` ->
``np.array``) count once. :class:`CountSyncs` is a callback that counts during
the steps that do not log (the trainer's one sync point is the logging step)
and records where each sync came from. Keep evaluation and saving off
in the counted runs, or on logging steps only.
"""

from __future__ import annotations

import contextlib
import traceback

import paddle

from callbacks import Callback

_METHODS = ("numpy", "__array__", "item", "tolist", "__float__", "__int__", "__index__", "__bool__", "__nonzero__")


class CountSyncs(Callback):
    order = -1000  # first at step begin

    def __init__(self):
        self.per_step = []     # syncs in each non-logging step
        self.sources = []      # (method, calling frame) of each counted sync
        self._counting = False
        self._count = 0
        self._depth = 0

    def on_step_begin(self, trainer):
        self._close()
        s = trainer.state
        logs_now = (s.global_step + 1) % trainer.args.logging_steps == 0 or s.global_step + 1 >= s.max_steps
        self._counting, self._count = not logs_now, 0

    def on_fit_end(self, trainer):
        self._close()

    def _close(self):
        # a window runs from one step's begin to the next one's: every hook of the step and
        # the trainer's after-step actions are inside it
        if self._counting:
            self.per_step.append(self._count)
        self._counting = False

    @contextlib.contextmanager
    def installed(self):
        originals = {name: getattr(paddle.Tensor, name) for name in _METHODS if hasattr(paddle.Tensor, name)}

        def wrap(name, fn):
            def counted(tensor, *args, **kwargs):
                if self._depth == 0 and self._counting:
                    self._count += 1
                    self.sources.append((name, "".join(traceback.format_stack(limit=4)[:-1])))
                self._depth += 1
                try:
                    return fn(tensor, *args, **kwargs)
                finally:
                    self._depth -= 1
            return counted

        for name, fn in originals.items():
            setattr(paddle.Tensor, name, wrap(name, fn))
        try:
            yield self
        finally:
            for name, fn in originals.items():
                setattr(paddle.Tensor, name, fn)
