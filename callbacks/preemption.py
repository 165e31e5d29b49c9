"""Preemption: on SIGTERM or SIGINT, every rank finishes the same step, a
checkpoint is saved, and the run ends with status ``preempted``.

Events: ``on_fit_begin`` (install signal handlers; main thread only),
``on_step_end`` (agree across ranks, then ask for a save and a stop),
``on_eval_step_end`` (note a signal during a long evaluation: the run stops
at the step boundary right after it), ``on_fit_end`` (restore handlers).
Options: ``signals`` (default SIGTERM, SIGINT), ``check_every`` (steps between
agreements in multi-process runs, default 1). State saved: none.

A signal only sets a flag. A single process checks it at every step end (no
cost). With several processes the ranks must stop at the same step, so every
``check_every`` steps each rank starts a one-element all-reduce (max) of its
flag and reads the one it started ``check_every`` steps earlier: all ranks
read the same value at the same step, and the host never waits for the step
it just queued (on GPUs the read waits only for work queued one interval ago).
A second signal exits at once (exit code 128 + signal number); checkpoint
files are written under temporary names and ``latest`` moves last, so no
half-written checkpoint is left in place. ``ptrain`` exits with 128 + the
signal number (143 for SIGTERM, 130 for SIGINT) after a preempted run.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import paddle

from .base import Callback

logger = logging.getLogger("callbacks.preemption")


class Preemption(Callback):
    order = 5

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT), check_every: int = 1):
        self.signals = tuple(signals)
        self.check_every = max(1, int(check_every))
        self.signum = None          # the signal received on this rank
        self.agreed_signum = None   # the signal all ranks agreed to act on
        self._previous = {}
        self._pending = None
        self._noted = False

    # ---- signals ---------------------------------------------------------------
    def _handle(self, signum, frame):
        if self.signum is not None:  # second signal: leave now
            os._exit(128 + signum)
        self.signum = signum
        logger.warning("received %s: finishing this step, saving a checkpoint, then stopping "
                       "(send it again to exit at once)", signal.Signals(signum).name)

    def on_fit_begin(self, trainer):
        self.signum = self.agreed_signum = self._pending = None
        self._noted = False
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)

    def on_fit_end(self, trainer):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self.agreed_signum is not None and trainer.state.status != "failed":
            trainer.state.status = "preempted"

    # ---- agreement ---------------------------------------------------------------
    def _agreed(self, trainer) -> int:
        local = self.signum or 0
        if trainer.world_size == 1:
            return local
        if trainer.state.global_step % self.check_every:
            return 0
        import paddle.distributed as dist

        previous = self._pending
        self._pending = paddle.to_tensor([local], dtype="int32")
        dist.all_reduce(self._pending, op=dist.ReduceOp.MAX)
        return int(previous.numpy()[0]) if previous is not None else 0

    def on_step_end(self, trainer):
        if self.agreed_signum is not None:
            return
        agreed = self._agreed(trainer)
        if agreed:
            self.agreed_signum = agreed
            state = trainer.state
            state.should_stop = True
            state.should_save = trainer.args.save_strategy != "no"
            state.status = "preempted"
            if trainer.is_main_process:
                logger.warning("preempted by %s at step %d: saving and stopping", signal.Signals(agreed).name,
                               state.global_step)

    def on_eval_step_end(self, trainer):
        if self.signum is not None and not self._noted:
            self._noted = True
            logger.warning("signal received during evaluation: the run stops at the next step boundary")

    @property
    def exit_code(self) -> int:
        return 128 + self.agreed_signum if self.agreed_signum else 0
