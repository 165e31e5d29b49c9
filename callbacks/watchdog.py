"""StallWatchdog: a heartbeat per rank that names the rank that is stuck or slow.

Two failures make a multi-process job hang or crawl without a word: a rank
that stops making progress (a dead NFS mount under the dataset, a deadlocked
DataLoader worker, a collective the other ranks never join), and a rank that
runs far behind the others (every rank then waits for it in the gradient
exchange, so every rank looks equally slow). This callback tells them apart
and names the rank.

Stalls. Each rank runs a daemon thread (``StallWatchdog-rank<r>``) that wakes
every ``check_interval`` seconds and compares the host clock with the last
heartbeat: ``on_step_end`` records a host timestamp (no device sync), and so do
``on_epoch_begin`` and every evaluation batch. When nothing has beaten for
``timeout`` seconds the thread logs, once per stall, which rank is stuck, its
last finished step, how long ago, and what it was doing (training or
evaluation), then dumps the Python stacks of all the process's threads
(``faulthandler.dump_traceback(all_threads=True)``) into the log (stderr) and
appends them to ``output_dir/stall-rank<r>.txt``. (Every rank writes its own
report: the stuck rank is the one that knows its stacks.) The stuck rank's
dump points at the culprit (e.g. the dataset's ``__getitem__``); the ranks
waiting for it report too, their main thread inside the collective. When the
rank finishes a step again it logs how long the stall lasted.

Blame. In synchronous data parallelism a rank that stalls makes every other
rank stall too, inside the collective that waits for it; each rank's own clock
says only "no step for N s". So every rank shares where it is outside any
collective: its watchdog thread writes ``output_dir/.ptrain-progress/rank<r>.json``
every ``check_interval`` (a mark the main thread sets with a host tuple at step
begin, at the entry to the gradient exchange, at step end and per evaluation
batch; no I/O in the loop). A stall report then starts with the rank that is
behind and what it is doing, and on the waiting ranks whom they wait for::

    StallWatchdog: rank 1 is behind: in step 4, before the gradient exchange (loading data or computing);
    rank 0 waits for rank 1 (in the gradient exchange or optimizer update of step 4); rank 0 has finished ...

A rank whose file has not changed for ``max(3 x check_interval, 2 s)`` is
named as giving no sign of life (killed or frozen); one with no file as having
shared no progress (on several nodes ``output_dir`` must be shared, as it must
for checkpoints). The file is removed at the end of ``fit()``.

With ``action='stop'`` the thread then waits for the other ranks' reports
(each marks its progress file once it has written one; at most
``report_grace`` = ``min(timeout, 60)`` seconds, not for a rank that gives no
sign of life: the backend aborts the ranks waiting in a collective as soon as
one rank leaves, which would cut their reports) and ends the process with exit code
**124** (``EXIT_CODE``, as coreutils ``timeout``); ``paddle.distributed.launch``
sees a rank fail and tears the job down, instead of every rank hanging until a
cluster time limit. This is not a clean stop, and cannot be one: a process
stuck inside a collective or a blocking read never returns to Python code
where it could raise, and no other thread can interrupt it. So the watchdog
thread flushes the logs and calls ``os._exit(124)``: no ``on_fit_end`` runs
and no checkpoint is written. Nothing is lost beyond the steps since the last
checkpoint: checkpoints are published complete-or-nothing, a write in flight
is left as a ``.tmp-*`` directory that the next run deletes, and
``checkpoints/latest`` still names the last complete one, so
``resume_from_checkpoint=auto`` continues from there (the run lock left in
output_dir names a dead process, so the next run takes it over).

If the stuck call holds the GIL (a C extension that does not release it), no
Python thread can run at all, the watchdog's included. As a backstop the
watchdog thread keeps re-arming ``faulthandler.dump_traceback_later(timeout)``
whenever it runs; if it has not run for ``timeout`` seconds, faulthandler's C
thread dumps every thread's stack to stderr (fd 2) under a ``Timeout (...)!``
header and, with ``action='stop'``, exits with status 1 (faulthandler's own
exit). Paddle's collectives and ops release the GIL while they wait, so this
path is rare. It owns faulthandler's single ``dump_traceback_later`` timer
during ``fit()``.

Evaluation and checkpoints: evaluation is covered, each evaluation batch is a
heartbeat, so a long evaluation never trips the watchdog while a stuck one
does. Saving and loading a checkpoint pause the clock
(``on_save_begin``/``on_save_end``, ``on_load_begin``/``on_load_end``): a large
synchronous save is one long disk-bound call with nothing to beat; the clock
restarts from zero when it ends. (A failed background write surfaces as a
``TrainingError`` at the next step boundary.) The clock starts when the
first epoch begins, after ``fit()`` has set up the process group (rendezvous
has its own timeouts in paddle and holds the GIL while it waits); the first
step, DataLoader start-up included, gets the same ``timeout``.

Slow ranks. Every rank measures, per optimizer step, its *work time*: host
seconds from ``on_step_begin`` to the ``on_backward_begin`` of the step's last
micro-batch, i.e. loading its batches and the forward passes (plus the
backward passes of accumulation micro-batches) before it joins the gradient
exchange. Step times are useless here: in synchronous data parallelism every
rank waits for the slowest inside the all-reduce, so all step times are equal.
At each training log record (``on_log``, where the ranks have just reduced the
loss together) the ranks all-reduce their window means (work time, data wait,
step time; one small collective); when one rank's mean work time is more than
``slow_factor`` x the median of the other ranks' and at least
``slow_min_seconds`` longer, rank 0 logs a warning naming the rank and the
figures (again while it stays slow, every ``repeat_every`` records). On GPUs
kernels run asynchronously, so work time measures the host side (data
loading, Python, kernel launches): a slow data pipeline or an overloaded host
shows; a slow GPU shows as a slow step on every rank. The first step of every
epoch (loader start-up) is left out of the figures.

Events: ``on_fit_begin`` (reset), ``on_epoch_begin`` (start the thread and
the backstop, the first time; a heartbeat), ``on_fit_end`` (stop them),
``on_step_begin``, ``on_backward_begin``, ``on_step_end`` (host timestamps),
``on_log`` (slow-rank check), ``on_eval_begin`` / ``on_eval_step_end`` /
``on_eval_end`` (heartbeats),
``on_save_begin`` / ``on_save_end`` / ``on_load_begin`` / ``on_load_end``
(pause). Options: ``timeout`` (seconds, default 600), ``action`` (``'warn'``
or ``'stop'``), ``check_interval`` (default ``timeout / 20``, between 0.05 and
5 s), ``slow_factor`` (default 3.0), ``slow_min_seconds`` (default 0.02),
``repeat_every`` (default 10). State saved: none. What it saw is kept on the
instance: ``stalls`` and ``slow_reports`` (lists of dicts).

On by default in multi-process runs (``callbacks.defaults``); remove it with
``trainer.remove_callback(StallWatchdog)`` or change it before ``fit()``
through ``trainer.callbacks.get(StallWatchdog)``.

    >>> w = StallWatchdog(timeout=60, action="stop")
    >>> w.timeout, w.action, w.check_interval, StallWatchdog.EXIT_CODE
    (60.0, 'stop', 3.0, 124)
"""

from __future__ import annotations

import faulthandler
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import List, Optional

from trainer.errors import ConfigError
from trainer.heap import start_waiting_thread

from .base import Callback
from .stall_blame import ProgressBoard

logger = logging.getLogger("callbacks.watchdog")

EXIT_CODE = 124
ACTIONS = ("warn", "stop")


class StallWatchdog(Callback):
    order = 85  # a monitor: before the loggers, so its on_log runs where the other monitors' do
    EXIT_CODE = EXIT_CODE

    def __init__(self, timeout: float = 600.0, slow_factor: float = 3.0, action: str = "warn",
                 check_interval: Optional[float] = None, slow_min_seconds: float = 0.02, repeat_every: int = 10):
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigError(f"StallWatchdog(timeout={timeout!r}) is not allowed: give the seconds without a finished step, > 0")
        if action not in ACTIONS:
            raise ConfigError(f"StallWatchdog(action={action!r}) is not allowed: choose one of {', '.join(ACTIONS)}")
        if isinstance(slow_factor, bool) or not isinstance(slow_factor, (int, float)) or not slow_factor > 1:
            raise ConfigError(f"StallWatchdog(slow_factor={slow_factor!r}) is not allowed: give a number > 1")
        if check_interval is not None and (isinstance(check_interval, bool) or not isinstance(check_interval, (int, float))
                                           or not check_interval > 0):
            raise ConfigError(f"StallWatchdog(check_interval={check_interval!r}) is not allowed: give seconds > 0 or None")
        if not isinstance(slow_min_seconds, (int, float)) or slow_min_seconds < 0:
            raise ConfigError(f"StallWatchdog(slow_min_seconds={slow_min_seconds!r}) is not allowed: give seconds >= 0")
        if isinstance(repeat_every, bool) or not isinstance(repeat_every, int) or repeat_every < 1:
            raise ConfigError(f"StallWatchdog(repeat_every={repeat_every!r}) is not allowed: give an integer >= 1")
        self.timeout = float(timeout)
        self.action = action
        self._check_interval = None if check_interval is None else float(check_interval)
        self.slow_factor = float(slow_factor)
        self.slow_min_seconds = float(slow_min_seconds)
        self.repeat_every = repeat_every
        self.stalls: List[dict] = []        # one per stall: rank, step, seconds, phase, report path
        self.slow_reports: List[dict] = []  # one per log record with a slow rank (every rank keeps them)
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._board: Optional[ProgressBoard] = None
        self._reset_run()

    @property
    def check_interval(self) -> float:
        if self._check_interval is not None:
            return self._check_interval
        return min(5.0, max(0.05, self.timeout / 20))

    @property
    def report_grace(self) -> float:
        """How long a stopping rank waits for the other ranks' stall reports: ``min(timeout, 60)`` seconds."""
        return min(self.timeout, 60.0)

    def _reset_run(self) -> None:
        self._beat = (time.monotonic(), 0)  # (host time, global step) of the last heartbeat; one attribute, one store
        self._phase = "training"
        self._paused = 0
        self._reported_beat = None          # the heartbeat a stall was reported for (once per stall)
        self._stalled_since = None
        self._skip_step = True
        self._mark = (0, 0, 0)              # (finished steps, 0 after a step | 1 before the exchange | 2 in it, eval batches)
        self._step_start = self._work_end = None
        self._slow_streak = {}              # rank -> log records in a row it was slow
        self._reset_window()

    def _reset_window(self) -> None:
        self._work = self._wait = self._time = 0.0
        self._steps = 0

    # ---- heartbeats (main thread: host clocks only) ----------------------------------
    def _pulse(self, step: int) -> None:
        self._beat = (time.monotonic(), step)

    def on_fit_begin(self, trainer):
        self._reset_run()
        self._rank = trainer.rank
        self._world = trainer.world_size
        self._out_dir = trainer.args.output_dir
        self._board = ProgressBoard(self._out_dir, self._rank, self._world, self.check_interval) \
            if self._world > 1 else None
        self._mark = (trainer.state.global_step, 0, 0)

    def on_epoch_begin(self, trainer):
        self._pulse(trainer.state.global_step)
        if self._thread is None:  # the clock starts with the first epoch, after the process group is set up
            self._stop.clear()
            self._arm_backstop()  # armed here too: the thread may never get the GIL to arm it
            self._thread = start_waiting_thread(
                threading.Thread(target=self._watch, name=f"StallWatchdog-rank{self._rank}", daemon=True))

    def on_step_begin(self, trainer):
        self._step_start, self._work_end = time.perf_counter(), None
        self._mark = (trainer.state.global_step, 1, 0)  # a host tuple: where this rank is, for the blame

    def on_backward_begin(self, trainer):
        state = trainer.state
        if state.micro_step == state.num_micro_batches - 1:  # about to join the gradient exchange
            self._work_end = time.perf_counter()
            self._mark = (state.global_step, 2, 0)

    def on_step_end(self, trainer):
        state = trainer.state
        self._pulse(state.global_step)
        self._mark = (state.global_step, 0, 0)
        if self._stalled_since is not None:
            logger.warning("StallWatchdog: rank %d finished step %d after a stall of %.1f s", self._rank,
                           state.global_step, time.monotonic() - self._stalled_since)
            self._stalled_since = None
        if self._skip_step or state.step_in_epoch == 1:  # loader start-up: a one-off, not the rank's pace
            self._skip_step = False
            return
        if self._step_start is not None:
            end = self._work_end if self._work_end is not None else time.perf_counter()
            self._work += end - self._step_start
            self._wait += state.last_data_wait
            self._time += state.last_step_time
            self._steps += 1

    def on_eval_begin(self, trainer):
        self._phase = "evaluation"
        self._pulse(trainer.state.global_step)

    def on_eval_step_end(self, trainer):
        self._pulse(trainer.state.global_step)
        step, sub, batches = self._mark
        self._mark = (trainer.state.global_step, 0, batches + 1 if sub == 0 else 1)

    def on_eval_end(self, trainer):
        self._phase = "training"
        self._pulse(trainer.state.global_step)

    def on_save_begin(self, trainer):
        self._paused += 1

    def on_save_end(self, trainer):
        self._pulse(trainer.state.global_step)  # restart the clock before un-pausing it
        self._paused = max(0, self._paused - 1)

    on_load_begin = on_save_begin
    on_load_end = on_save_end

    def on_fit_end(self, trainer):
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=self.check_interval + 5.0)
        faulthandler.cancel_dump_traceback_later()
        if self._board is not None:
            self._board.remove()

    # ---- slow ranks (on_log: every rank logs the same training records) ------------------
    def on_log(self, trainer):
        if "loss" not in trainer.state.logs:  # evaluation records carry no step timings
            return
        steps, sums = self._steps, (self._work, self._wait, self._time)
        self._reset_window()
        world = trainer.world_size
        if world <= 1:
            return
        from trainer.distributed import reduce_scalars

        local = [s / steps if steps else 0.0 for s in sums]
        values = [0.0] * (3 * world + 1)
        values[3 * trainer.rank:3 * trainer.rank + 3] = local
        values[-1] = 1.0 if steps == 0 else 0.0  # any rank without a measured step: no verdict this time
        values = reduce_scalars(values, op="sum")  # the one collective, at a point where ranks already meet
        if values[-1] > 0:
            return
        work, wait, step_time = values[0:-1:3], values[1:-1:3], values[2:-1:3]
        slow = []
        for r in range(world):
            others = statistics.median(work[:r] + work[r + 1:])
            if work[r] > self.slow_factor * others and work[r] - others >= self.slow_min_seconds:
                slow.append((r, others))
        for r in [r for r in self._slow_streak if r not in {s for s, _ in slow}]:
            del self._slow_streak[r]
            if trainer.is_main_process:
                logger.info("StallWatchdog: rank %d keeps pace again (step %d)", r, trainer.state.global_step)
        for r, others in slow:
            streak = self._slow_streak.get(r, 0)
            self._slow_streak[r] = streak + 1
            report = {"step": trainer.state.global_step, "rank": r, "work_time": work[r], "data_wait": wait[r],
                      "others_median": others, "ratio": work[r] / max(others, 1e-12), "step_time": step_time[r],
                      "steps": steps}
            self.slow_reports.append(report)
            if trainer.is_main_process and streak % self.repeat_every == 0:
                logger.warning(
                    "StallWatchdog: rank %d is %sslow: over the last %d steps (to step %d) it took %.3f s per step "
                    "before joining the gradient exchange (%.3f s of it waiting for data), %.1fx the median of the "
                    "other ranks (%.3f s); every rank waits for it (step time %.3f s). Per-rank work times: %s",
                    r, "still " if streak else "", steps, trainer.state.global_step, work[r], wait[r],
                    report["ratio"], others, step_time[r], ", ".join(f"{t:.3f}" for t in work))

    # ---- the watchdog thread --------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(self.check_interval):
            self._arm_backstop()
            if self._board is not None:
                self._board.publish(self._mark)
            if self._paused:
                continue
            beat_time, step = self._beat
            idle = time.monotonic() - beat_time
            if idle < self.timeout or self._reported_beat == beat_time:
                continue
            self._reported_beat = beat_time
            self._stalled_since = beat_time
            try:
                self._report(step, idle)
            except Exception as exc:  # noqa: BLE001 - a failed report must not stop the stop
                logger.error("StallWatchdog: could not write the stall report: %s", exc)
            if self._board is not None:
                self._board.publish(self._mark, reported=True)
            if self.action == "stop":
                if self._board is not None:
                    self._board.wait_for_reports(self.report_grace, self.check_interval)
                self._exit()

    def _arm_backstop(self) -> None:
        """Re-armed whenever this thread runs, so it fires only if the thread starves (a call holding the GIL)."""
        faulthandler.dump_traceback_later(self.timeout, exit=self.action == "stop", file=sys.__stderr__ or 2)

    def _report(self, step: int, idle: float) -> None:
        rank, phase = self._rank, self._phase
        blame = None
        try:
            blame = self._board.blame(self._mark) if self._board is not None else None
        except Exception as exc:  # noqa: BLE001 - the report goes out without it
            logger.error("StallWatchdog: could not read the other ranks' progress: %s", exc)
        header = (("StallWatchdog: " + blame + "; " if blame else "StallWatchdog: ")
                  + f"rank {rank} has finished no {'training step' if phase == 'training' else 'batch'} "
                  f"for {idle:.1f} s (timeout {self.timeout:g} s); last finished step {step}, now in {phase}; "
                  f"pid {os.getpid()}, {time.strftime('%Y-%m-%d %H:%M:%S')}")
        names = ", ".join(f"0x{t.ident:016x}={t.name}" for t in threading.enumerate() if t.ident is not None)
        with tempfile.TemporaryFile("w+", encoding="utf-8") as tmp:
            faulthandler.dump_traceback(file=tmp, all_threads=True)
            tmp.seek(0)
            stacks = tmp.read()
        text = f"{header}\nthreads: {names}\n{stacks}"
        path = os.path.join(self._out_dir, f"stall-rank{rank}.txt")
        try:
            os.makedirs(self._out_dir, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write(text + "\n")
        except OSError as exc:
            logger.error("StallWatchdog: could not write %s (%s): the stacks are in the log only", path, exc)
            path = None
        self.stalls.append({"rank": rank, "step": step, "seconds": idle, "phase": phase, "report": path, "blame": blame})
        action = (f"stopping this process with exit code {EXIT_CODE} so the launcher ends the job"
                  if self.action == "stop" else "training goes on if the rank recovers")
        logger.error("%s; %s. Stacks of its threads (also in %s):\nthreads: %s\n%s", header, action,
                     path or "the log only", names, stacks)

    def _exit(self) -> None:
        for handler in logging.getLogger().handlers + logger.handlers:
            try:
                handler.flush()
            except Exception:  # noqa: BLE001 - exiting anyway
                pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - exiting anyway
                pass
        os._exit(EXIT_CODE)

    def __repr__(self) -> str:
        return (f"StallWatchdog(timeout={self.timeout:g}, action={self.action!r}, slow_factor={self.slow_factor:g}, "
                f"order={self.order})")
