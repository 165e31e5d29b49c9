"""Preemption: on SIGTERM (or SIGHUP, handled as SIGTERM), SIGINT or SIGUSR1,
every rank finishes the same step, a checkpoint of it is saved (even with
``save_strategy`` no, unless ``save_on_preemption`` is false) and the run ends
with status ``preempted``: exit 143 (SIGTERM, SIGHUP), 130 (SIGINT) or 138
(SIGUSR1: Slurm's ``--signal=USR1@N``, "checkpoint now, then requeue me"); see
docs/how-to/preemption.md and docs/reference/exit-codes.md.

Events: ``on_fit_begin`` (install signal handlers; main thread only),
``on_step_end`` (agree across ranks, then ask for a save and a stop),
``on_eval_step_end`` / ``on_save_begin`` / ``on_save_end`` (progress marks:
a long evaluation or save is not a stall), ``on_fit_end`` (wait until every
rank is done, restore handlers; after a preemption the process ends with
its code even when the script simply returns: ``trainer.process.hand_off_exit_code``;
``evaluate()`` / ``predict()`` then raise ``trainer.errors.Preempted`` on every
rank, so no collective starts while ranks leave). Options: ``signals`` (default
``trainer.process.STOP_SIGNALS``), ``check_every`` (steps between agreement checks, default
``logging_steps``),
``stall_seconds`` and ``save_seconds`` (the time bounds below; defaults from
``PTRAIN_PREEMPT_STALL_SECONDS`` / ``PTRAIN_PREEMPT_SAVE_SECONDS``, else 15 and
300). State saved: none.

Which signals count. The first stop signal starts a graceful stop. A
later SIGTERM is never "exit now": paddle's launcher sends SIGTERM to each
worker up to 3 times 0.2 s apart, and again when another rank has exited
first; a cluster that signals every process of a job makes the worker see its
own SIGTERM and the launcher's. Only a later SIGINT (a second Ctrl-C, or
``ptrain`` forwarding one) exits at once with 130; files are written under
temporary names and ``latest`` moves last, so no half-written checkpoint is
left in place.

Agreement without a device sync. One process checks its flag at every step
end (no cost). With several processes the ranks must stop at the same step;
they agree through the TCPStore that ``init_parallel_env`` created (a host
channel: no tensor, no device sync). A rank that received the signal at the
end of step ``s`` proposes to stop at the next multiple of the check interval
after ``s`` (3 store round trips, once); the first proposal wins; every rank
reads it with one store round trip (``add(key, 0)``) at each multiple of the
interval. No rank can have finished that step yet (it needs the proposer's
gradients), so all stop at the same step, 1 to ``interval`` steps after the
signal. The interval is ``check_every`` (``PTRAIN_PREEMPT_CHECK_EVERY``), by
default ``logging_steps``: paddle 3.3.1's store client takes about 45 ms per
round trip (measured here), too slow for every step, so the check rides on the
logging steps, where the ranks meet anyway. Lower it when ``logging_steps`` x
step time comes near your cluster's grace period.

Time bounds. While the main thread makes progress (steps, evaluation
batches, saves) the stop waits for the agreed step. If nothing progresses for
``stall_seconds`` after the signal (a ``__getitem__`` that blocks, a rank
stuck in a collective, a rendezvous that never completes), a watcher thread
ends the process with 128 + signal: a single process waiting for data first
saves its last finished step from that thread (its state is exactly that
step's). A signal before the first step of this ``fit()`` ends the process
within 3 s (nothing to save). After the agreement, the save and the wait
below have ``save_seconds`` until ``fit()`` returns: all ranks wait for each
other (store barrier) so that no rank exits while rank 0 still writes:
paddle's launcher kills the remaining ranks 3 s after the first one exits.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from typing import Optional

from trainer import process
from trainer.heap import start_waiting_thread

from .base import Callback

logger = logging.getLogger("callbacks.preemption")
_FITS = [0]  # fit() calls in this process: a fresh store namespace for each


def _env_seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class Preemption(Callback):
    order = 5

    def __init__(self, signals=process.STOP_SIGNALS, check_every: Optional[int] = None,
                 stall_seconds: float = None, save_seconds: float = None):
        self.signals = tuple(signals)
        if check_every is None and os.environ.get("PTRAIN_PREEMPT_CHECK_EVERY"):
            check_every = int(os.environ["PTRAIN_PREEMPT_CHECK_EVERY"])
        self.check_every = None if check_every is None else max(1, int(check_every))
        self.stall_seconds = stall_seconds if stall_seconds is not None else \
            _env_seconds("PTRAIN_PREEMPT_STALL_SECONDS", 15.0)
        self.save_seconds = save_seconds if save_seconds is not None else \
            _env_seconds("PTRAIN_PREEMPT_SAVE_SECONDS", 300.0)
        self.signum = None          # the signal received on this rank
        self.agreed_signum = None   # the signal all ranks agreed to act on
        self._previous = {}
        self._startup_was = None    # the start-up exit's setting before on_fit_begin (None: fit never began)
        self._reset()

    def _reset(self):
        self.signum = self.agreed_signum = None
        self._signal_time = self._agreed_time = None
        self._progress = time.monotonic()
        self._steps_done = 0
        self._saving = False
        self._noted = False
        self._proposed = False
        self._stop_at = None
        self._store = None
        self._prefix = None
        self._trainer = None
        self._every = 1
        self._deadline = None
        self._finished = threading.Event()
        self._watching = False
        self._lock = threading.Lock()
        self._seen = {"handler": 0, "watcher": 0}
        self._acted = 0

    # ---- signals ---------------------------------------------------------------
    def _handle(self, signum, frame):
        """Python-level handler (main thread, at the next bytecode after the signal)."""
        self._note(signum, "handler")
        if self._steps_done == 0 and not self._finished.is_set():
            raise SystemExit(128 + process.stop_signal(signum))  # before the first step: nothing to save

    def _from_watcher(self, signum: int) -> None:
        """The watcher thread: sees each delivery even when the main thread is stuck in C++."""
        self._note(signum, "watcher")

    def _note(self, signum: int, source: str) -> None:
        # both the handler and the watcher report every delivery (the handler may merge two
        # pending ones): act once per delivery, whichever reports it first
        received, signum = signum, process.stop_signal(signum)  # SIGHUP is SIGTERM
        with self._lock:
            self._seen[source] += 1
            count = max(self._seen.values())
            if count <= self._acted:
                return
            self._acted = count
        if self._finished.is_set() and self.agreed_signum is None:
            return
        if self.signum is None:
            self.signum, self._signal_time = signum, time.monotonic()
            args = getattr(self._trainer, "args", None)
            save = "saving a checkpoint" if args is None or args.save_on_preemption else \
                "saving nothing (save_on_preemption is false)"
            then = ("then exiting %d to be requeued" % process.REQUEUE_EXIT if signum == signal.SIGUSR1 else
                    "then stopping")
            logger.warning("received %s%s: finishing this step, %s, %s (Ctrl-C again to exit at once)",
                           signal.Signals(received).name, _sender_note(received, signum), save, then)
            self._start_deadline()
        elif signum == signal.SIGINT:
            process.exit_now(128 + signum, "ptrain: second interrupt: exiting at once without a new checkpoint "
                                           "(checkpoints/latest names the last complete one)")
        else:
            logger.info("%s again: ignored (already stopping)", signal.Signals(signum).name)

    def on_fit_begin(self, trainer):
        self._reset()
        process.hand_off_exit_code(0)  # a new fit(): its own outcome decides
        _FITS[0] += 1
        self._prefix = f"ptrain/preempt/{_FITS[0]}/"
        self._trainer = trainer
        self._every = self.check_every or max(1, int(trainer.args.logging_steps or 1))
        self._startup_was = process.startup_handlers_active(False)
        if "PADDLE_TRAINER_ID" in os.environ:  # under paddle's launcher (also without ptrain): die with it
            process.die_with_parent(signal.SIGTERM)
        if threading.current_thread() is threading.main_thread():
            # one the process started with ignored (nohup) stays so; SA_RESTART; unblocked
            self._previous.update(process.catch(self.signals, self._handle))
            self._watching = process.WATCHER.start()
            if self._watching:
                process.WATCHER.subscribe(self._from_watcher)

    def on_fit_end(self, trainer):
        if self.agreed_signum is not None and trainer.state.status != "failed":
            trainer.state.status = "preempted"
            trainer.state.exit_code = self.exit_code
            self._wait_for_all_ranks(trainer)
            process.hand_off_exit_code(self.exit_code)  # the script may simply end: the code still reaches the shell
        self._finished.set()  # the deadline thread ends: what follows fit() is the caller's
        process.WATCHER.unsubscribe(self._from_watcher)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
            signal.siginterrupt(sig, False)
        self._previous.clear()
        if self._startup_was is not None:  # on_fit_end runs even when fit() failed before on_fit_begin
            process.startup_handlers_active(self._startup_was)
            self._startup_was = None

    # ---- progress marks (the stall clock) ------------------------------------------
    def on_step_end(self, trainer):
        self._progress = time.monotonic()
        self._steps_done += 1
        if self.agreed_signum is not None:
            return
        agreed = self._agreed(trainer)
        if agreed:
            self.agreed_signum = agreed
            self._agreed_time = time.monotonic()
            state = trainer.state
            state.should_stop = True
            state.should_save = bool(trainer.args.save_on_preemption)  # whatever save_strategy says
            state.status = "preempted"
            state.exit_code = self.exit_code
            if trainer.is_main_process:
                logger.warning("preempted by %s at step %d: saving and stopping", signal.Signals(agreed).name,
                               state.global_step)

    def on_eval_step_end(self, trainer):
        self._progress = time.monotonic()
        if self.signum is not None and not self._noted:
            self._noted = True
            logger.warning("signal received during evaluation: the run stops at the next step boundary")

    def on_save_begin(self, trainer):
        self._saving = True

    def on_save_end(self, trainer):
        self._saving = False
        self._progress = time.monotonic()

    # ---- agreement -----------------------------------------------------------------
    def _agreed(self, trainer) -> int:
        if trainer.world_size == 1:
            return self.signum or 0
        store = self._get_store()
        if store is None:
            return 0
        step, k = trainer.state.global_step, self._every
        if self.signum and not self._proposed:
            self._proposed = True
            index = store.add(self._prefix + "count", 1)
            store.set(self._prefix + f"stop/{index}", f"{(step // k + 1) * k}:{self.signum}")
            store.add(self._prefix + "ready", 1)
        if step % k:
            return 0
        if self._stop_at is None:
            if store.add(self._prefix + "ready", 0) == 0:  # one round trip, nothing proposed yet
                return 0
            stop_at, signum = bytes(store.get(self._prefix + "stop/1")).decode().split(":")
            self._stop_at = (int(stop_at), int(signum))
        stop_at, signum = self._stop_at
        return signum if step >= stop_at else 0

    def _get_store(self):
        if self._store is None:
            import paddle.distributed as dist

            if not dist.is_initialized():
                return None
            from paddle.base import core

            self._store = core.create_or_get_global_tcp_store()  # the one init_parallel_env made
        return self._store

    def _wait_for_all_ranks(self, trainer) -> None:
        """Store barrier: every rank has finished the agreed step and rank 0 has written the
        checkpoint (fit() waits for the writer before on_fit_end).

        Rank 0 hosts the TCPStore, so it leaves last: every other rank's final store call is its
        ``left`` mark, and rank 0 waits for all of them before it returns (and exits, closing the
        store). Otherwise a rank still polling when rank 0's process ends would block in the store
        client's reconnect loop until the launcher kills it (seen: a rank killed before it could
        report its exit)."""
        if trainer.world_size == 1 or self._get_store() is None:
            return
        done, left = self._prefix + "done", self._prefix + "left"
        deadline = time.monotonic() + self.save_seconds
        try:
            count = self._store.add(done, 1)
            while count < trainer.world_size and time.monotonic() < deadline:
                time.sleep(0.05)
                count = self._store.add(done, 0)
            if trainer.rank != 0:
                self._store.add(left, 1)  # this rank's last store call
                return
            while self._store.add(left, 0) < trainer.world_size - 1 and time.monotonic() < deadline:
                time.sleep(0.02)
        except Exception as exc:  # noqa: BLE001 - a peer that already left closes the store
            logger.info("preemption barrier ended early: %s", exc)

    # ---- the deadline thread ----------------------------------------------------------
    def _start_deadline(self) -> None:
        if self._deadline is None:
            self._deadline = start_waiting_thread(
                threading.Thread(target=self._watch_deadline, name="ptrain-preempt-deadline", daemon=True))

    def _watch_deadline(self) -> None:
        while not self._finished.wait(0.2):
            now, signum = time.monotonic(), self.signum
            name = signal.Signals(signum).name
            if self._agreed_time is not None:
                if now - self._agreed_time > self.save_seconds:
                    process.exit_now(128 + signum, f"ptrain: the preempted run did not finish its save and exit "
                                                   f"within {self.save_seconds:.0f} s: exiting {128 + signum}")
                continue
            if self._steps_done == 0 and now - self._signal_time > process.STARTUP_EXIT_SECONDS:
                process.exit_now(128 + signum, f"ptrain: {name} before the first step: exiting {128 + signum} "
                                               "(nothing trained in this run yet)")
            if self._saving or now - max(self._progress, self._signal_time) <= self.stall_seconds:
                continue
            self._stuck(signum, now - max(self._progress, self._signal_time))

    def _stuck(self, signum: int, idle: float) -> None:
        trainer, name = self._trainer, signal.Signals(signum).name
        where = "waiting for data" if _main_thread_in("_next_batch") else "inside a step (collective or compute)"
        sys.stderr.write(f"ptrain: rank {trainer.rank}: {name} {idle:.0f} s ago and no progress since: the main "
                         f"thread is {where}; stacks:\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        saved = ""
        if trainer.world_size == 1 and where == "waiting for data":
            saved = self._save_from_here(trainer)
        process.exit_now(128 + signum, f"ptrain: exiting {128 + signum} after {name}: {saved or 'no new checkpoint'}"
                                       f" (checkpoints/latest names the last complete one)")

    def _save_from_here(self, trainer) -> str:
        """Write the last finished step from this thread: the main thread is blocked in the
        data pipeline, between steps, so model, optimizer and state are that step's."""
        from trainer.checkpoint import writer
        from trainer.checkpoint.manifest import checkpoints_dir
        from trainer.checkpoint.snapshot import snapshot

        if not trainer.args.save_on_preemption:
            return ""
        try:
            trainer.wait_for_checkpoint()
            root = checkpoints_dir(trainer.args.output_dir)
            final = os.path.join(root, f"step-{trainer.state.global_step}")
            if os.path.isdir(final):
                return f"step {trainer.state.global_step} was already saved"
            trainer.state.status = "preempted"
            snap = snapshot(trainer)
            writer.remove_stale_temporaries(root)
            writer.write_snapshot(snap, final, root)
            return f"saved the last finished step {trainer.state.global_step}"
        except Exception as exc:  # noqa: BLE001 - leaving is the point; say why nothing was saved
            return f"the save of step {trainer.state.global_step} failed ({exc})"

    @property
    def exit_code(self) -> int:
        return 128 + self.agreed_signum if self.agreed_signum else 0


def _sender_note(received: int, signum: int) -> str:
    """What the signal's name alone would not tell: SIGHUP counts as SIGTERM; under paddle's raw launcher
    a SIGTERM may stand for the Ctrl-C the launcher got (it stops its ranks with SIGTERM whatever it received;
    ``ptrain`` passes SIGINT on as SIGINT)."""
    if received != signum:
        return " (handled as SIGTERM)"
    if signum == signal.SIGTERM and "PADDLE_TRAINER_ID" in os.environ and not os.environ.get(process.FAILURE_DIR_ENV):
        return (" from paddle's launcher, which stops its ranks with SIGTERM also after a Ctrl-C "
                "(under ptrain launch a Ctrl-C arrives as SIGINT and ends with 130)")
    return ""


def _main_thread_in(function_name: str) -> bool:
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        if frame.f_code.co_name == function_name:
            return True
        frame = frame.f_back
    return False
