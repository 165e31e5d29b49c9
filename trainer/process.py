"""Process lifetime: processes that die with their parent, and prompt exits on signals.

Every process a job starts must end when the job ends, whichever process is
signalled or killed first (docs/how-to/preemption.md):

- :func:`die_with_parent` asks the Linux kernel to send a signal to this
  process when its parent dies (``prctl(PR_SET_PDEATHSIG)``), and covers the
  race where the parent died before the call. The training processes get
  SIGTERM (they save and exit 143, see ``callbacks.preemption``), DataLoader
  workers SIGKILL (they hold nothing worth saving). Other systems: no-op,
  returns False.
- :func:`dataloader_worker_init` is the ``worker_init_fn`` of every DataLoader
  the trainer builds: the worker ignores the stop signals (a signal to the
  whole process group must not kill it under the training process, which
  would then fail with "DataLoader worker exited unexpectedly" in the middle
  of a save) and dies with its parent.
- :func:`install_startup_handlers` makes the stop signals (:data:`STOP_SIGNALS`:
  SIGTERM, SIGHUP = SIGTERM, SIGINT, SIGUSR1) end a process that has not
  started training yet at once with 128 + the signal number (143, 143, 130,
  138): there is nothing to save before ``fit()``. A signal the process started with ignored (``nohup``'s
  SIGHUP, a background ``cmd &``'s SIGINT: :data:`IGNORED_AT_START`) stays ignored. A watcher thread
  fed by ``signal.set_wakeup_fd`` enforces it even when the main thread sits
  in C++ code that never returns to Python (e.g. a rendezvous).
- :func:`guard_console`: ``ptrain``'s stdout and stderr survive a closed pipe (``ptrain ... | tee log``
  whose ``tee`` the same Ctrl-C killed, ``| head -1``): writes then go to ``/dev/null`` instead of raising
  ``BrokenPipeError`` in a signal path or in the interpreter's last flush.
- :func:`hand_off_exit_code`: a preempted ``fit()`` returns to the script,
  and the script may simply end; the process then still exits with the
  preemption's code (130 / 143 / 138), so that it reaches the launcher, ``ptrain``
  and the shell without the script calling ``sys.exit``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from typing import Callable, Optional

from .heap import start_waiting_thread

logger = logging.getLogger("trainer.process")

PR_SET_PDEATHSIG = 1
STARTUP_EXIT_SECONDS = 3.0  # a signal during start-up ends the process within this, whatever it is doing

#: the signals that stop a job gracefully (checkpoint, then exit): SIGTERM and SIGHUP (a closed terminal, the
#: same as SIGTERM), SIGINT (Ctrl-C), SIGUSR1 (Slurm's ``--signal=USR1@N``: checkpoint now, then requeue)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
#: the stop signals this process started with ignored: ``nohup`` ignores SIGHUP (the terminal may close), a
#: script's ``cmd &`` SIGINT. They stay ignored, as POSIX asks of a program that catches signals (and as Python
#: does for SIGINT); read when this module is first imported, before any handler of ours
IGNORED_AT_START = frozenset(s for s in STOP_SIGNALS if signal.getsignal(s) == signal.SIG_IGN)


def handled(signals=STOP_SIGNALS) -> tuple:
    """The signals of ``signals`` this process may catch: those it did not start with ignored."""
    return tuple(s for s in signals if s not in IGNORED_AT_START)


def catch(signals, handler) -> dict:
    """Install ``handler`` for each of ``signals`` this process may catch (:func:`handled`), with SA_RESTART
    (paddle's C++, the TCPStore and gloo, fails on EINTR instead of retrying), and unblock them in this thread: a
    blocked signal is inherited across ``exec`` too, and a handler of a signal that stays blocked never runs.
    Returns the handlers replaced (to put back with ``signal.signal``)."""
    previous = {}
    for sig in handled(signals):
        previous[sig] = signal.signal(sig, handler)
        signal.siginterrupt(sig, False)
    if previous and hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, list(previous))
    return previous


#: the exit code after SIGUSR1: the checkpoint is saved, requeue the job (docs/how-to/preemption.md); never
#: restarted by --max_restarts (the allocation is about to end)
REQUEUE_EXIT = 128 + signal.SIGUSR1
#: what a preempted rank exits with (SIGINT, SIGUSR1's requeue, SIGTERM/SIGHUP): it saved and stopped, not a failure
PREEMPTED_CODES = (130, REQUEUE_EXIT, 143)


def stop_signal(signum: int) -> int:
    """The signal ``signum`` counts as: SIGHUP is SIGTERM, the others are themselves."""
    return signal.SIGTERM if signum == signal.SIGHUP else signum


def set_parent_death_signal(sig: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)``: the kernel sends ``sig`` to this process when the
    thread that created it exits. Survives ``exec``. False where unsupported (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(sig: int = signal.SIGTERM, parent_pid: Optional[int] = None) -> bool:
    """Have ``sig`` delivered to this process when its parent dies.

    ``parent_pid`` is the parent seen when this process started (read it as
    early as possible); if the parent is already gone (this process was
    re-parented in between), ``sig`` is delivered now. Returns whether the
    kernel took the request.
    """
    parent = os.getppid() if parent_pid is None else parent_pid
    ok = set_parent_death_signal(sig)
    if ok and os.getppid() != parent:  # the parent died before prctl: the kernel will never send it
        os.kill(os.getpid(), sig)
    return ok


def dataloader_worker_init(worker_id: int, parent_pid: Optional[int] = None) -> None:
    """``worker_init_fn`` for DataLoader workers: ignore SIGTERM/SIGINT (the training process
    shuts its workers down), die with the training process (SIGKILL). ``parent_pid`` is the
    training process (bind it with ``functools.partial`` where the loader is made): a worker
    whose parent is already another process exits at once."""
    for sig in STOP_SIGNALS:  # a signal to the whole process group (a closed terminal: SIGHUP) is not for us
        signal.signal(sig, signal.SIG_IGN)
    if set_parent_death_signal(signal.SIGKILL) and parent_pid is not None and os.getppid() != parent_pid:
        os._exit(0)  # the training process died before prctl: the kernel will never send it


class _SignalWatcher:
    """One daemon thread woken by ``signal.set_wakeup_fd``: it sees every stop signal
    the moment the kernel delivers it, even while the main thread is blocked in C++
    code where Python signal handlers cannot run. It calls ``on_signal(signum)``."""

    def __init__(self):
        self._read_fd = None
        self._callbacks = []
        self._lock = threading.Lock()

    def start(self) -> bool:
        if self._read_fd is not None:
            return True
        if threading.current_thread() is not threading.main_thread() or os.name != "posix":
            return False
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(r)
            os.close(w)
            return False
        self._read_fd = r
        start_waiting_thread(threading.Thread(target=self._run, name="ptrain-signal-watch", daemon=True))
        return True

    def subscribe(self, fn: Callable[[int], None]) -> None:
        with self._lock:
            if fn not in self._callbacks:
                self._callbacks.append(fn)

    def unsubscribe(self, fn: Callable[[int], None]) -> None:
        with self._lock:
            if fn in self._callbacks:
                self._callbacks.remove(fn)

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:
                return
            for signum in data:
                if signum not in STOP_SIGNALS:
                    continue
                with self._lock:
                    callbacks = list(self._callbacks)
                for fn in callbacks:
                    try:
                        fn(signum)
                    except Exception:  # noqa: BLE001 - a watcher must outlive a bad callback
                        logger.exception("signal watcher callback failed")


WATCHER = _SignalWatcher()


def exit_now(code: int, message: str = "") -> None:
    """Flush what can be flushed and leave without running Python's teardown (any thread)."""
    if message:
        try:
            sys.stderr.write(message.rstrip("\n") + "\n")
        except Exception:  # noqa: BLE001
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)


class _Startup:
    """SIGTERM/SIGINT before training: exit 128 + signum at once (main thread), or after
    ``STARTUP_EXIT_SECONDS`` from the watcher thread if the main thread is stuck in C++."""

    def __init__(self):
        self.active = False

    def handler(self, signum, frame):
        if self.active:
            raise SystemExit(128 + stop_signal(signum))

    def watch(self, signum: int) -> None:
        if not self.active:
            return

        def later():
            time.sleep(STARTUP_EXIT_SECONDS)
            if self.active:
                code = 128 + stop_signal(signum)
                exit_now(code, f"ptrain: {signal.Signals(signum).name} outside training: exiting "
                               f"{code} (no step in progress, nothing to save)")

        threading.Thread(target=later, daemon=True).start()


_STARTUP = _Startup()


def install_startup_handlers() -> None:
    """SIGTERM / SIGHUP, SIGINT and SIGUSR1 end this process with 143, 130 and 138 until training starts
    (``fit()`` installs its own handlers, then restores these)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _STARTUP.active = True
    catch(STOP_SIGNALS, _STARTUP.handler)
    if WATCHER.start():
        WATCHER.subscribe(_STARTUP.watch)


def startup_handlers_active(active: bool) -> bool:
    """Switch the start-up exit off (``fit()`` owns the signals) or back on; returns the previous setting."""
    previous, _STARTUP.active = _STARTUP.active, active
    return previous


# ---- a console that is a closed pipe --------------------------------------------------------------------
class _PipeSafe:
    """``sys.stdout`` / ``sys.stderr`` whose reader may be gone (``| tee`` killed by the Ctrl-C that stops the
    job, ``| head -1``): the first write or flush that meets the closed pipe points the stream's file descriptor
    at ``/dev/null`` and carries on. Without it ``print`` raises ``BrokenPipeError`` wherever it happens to be
    (a signal handler, a callback) and the interpreter's last flush at exit fails too (exit code 120); Python's
    "Note on SIGPIPE" does the same ``dup2``. Everything else is the stream's own."""

    def __init__(self, stream):
        self._stream = stream

    @property
    def guarded(self):
        """The stream beneath (a handler made before the guard holds it)."""
        return self._stream

    def _closed(self) -> None:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._closed()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._closed()
            try:
                self._stream.flush()  # what was buffered goes to /dev/null: the pipe's reader is gone
            except (OSError, ValueError):
                pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


def guard_console() -> None:
    """Make ``sys.stdout`` and ``sys.stderr`` survive a closed pipe (:class:`_PipeSafe`); ``ptrain`` calls it first.
    Idempotent; a stream without a file descriptor (a test's capture) is left as it is."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, _PipeSafe):
            continue
        try:
            stream.fileno()
        except (OSError, ValueError, AttributeError):
            continue
        setattr(sys, name, _PipeSafe(stream))


# ---- the exit code of a preempted run ------------------------------------------------------------------
_HANDOFF = {"code": 0, "installed": False, "hook": None}


def hand_off_exit_code(code: int) -> None:
    """End this process with ``code`` when the script ends normally (also by ``sys.exit``), or raises
    ``trainer.errors.Preempted`` (one line, no traceback); another uncaught exception keeps Python's 1.
    ``0`` withdraws the request (a new ``fit()`` begins). The exit skips the interpreter's teardown after
    flushing the logs and streams, as ``ptrain``'s own entry script does (trainer/cli/launch_entry.py)."""
    if code and (hasattr(sys, "ps1") or sys.flags.interactive or "ipykernel" in sys.modules):
        return  # an interactive session (a REPL, Jupyter) is not a job: state.exit_code says it
    _HANDOFF["code"] = int(code)
    if code:
        _install_hooks()


def handed_off_exit_code() -> int:
    return _HANDOFF["code"]


def _install_hooks() -> None:
    if not _HANDOFF["installed"]:
        _HANDOFF["installed"] = True
        import atexit

        atexit.register(_exit_with_handed_off_code)
        _HANDOFF["hook"] = sys.excepthook
        sys.excepthook = _excepthook


def _excepthook(kind, value, tb) -> None:
    from .errors import Preempted

    if isinstance(value, Preempted):
        _HANDOFF["code"] = value.exit_code
        sys.stderr.write(f"ptrain: {value}\n")
        return
    folder = os.environ.get(FAILURE_DIR_ENV)
    if folder and value is not _HANDOFF.get("failure") and _is_trainer_error(value):
        # raised by the script outside fit() (TrainingArguments, Trainer(...)): recorded like fit()'s own, so
        # that its code (2 for a ConfigError) ends the job instead of Python's 1, which --max_restarts restarts
        record_failure(int(os.environ.get("PADDLE_TRAINER_ID") or 0), value)
    if folder and value is _HANDOFF.get("failure"):  # recorded for ptrain, which prints it once for all ranks
        import traceback

        _HANDOFF["code"] = _HANDOFF["failure_code"]
        try:
            with open(os.path.join(folder, f"rank-{_HANDOFF['failure_rank']}.traceback"), "w", encoding="utf-8") as f:
                f.write("".join(traceback.format_exception(kind, value, tb)))
        except OSError:
            sys.stderr.write(f"ptrain: {type(value).__name__}: {value}\n")
        return
    _HANDOFF["code"] = 0  # the script failed: Python's exit code 1 and its traceback
    (_HANDOFF["hook"] or sys.__excepthook__)(kind, value, tb)


def _exit_with_handed_off_code() -> None:
    code = _HANDOFF["code"]
    if code:
        logging.shutdown()
        exit_now(code)


# ---- failures a rank records for ptrain ---------------------------------------------------------------
#: set by ptrain's launcher for every worker: a folder where a rank whose fit() failed writes what happened,
#: so ptrain names the failure (any rank's, not only the one the launcher's exit code comes from) and does not
#: restart one that a restart cannot fix
FAILURE_DIR_ENV = "PTRAIN_FAILURE_DIR"


def _is_trainer_error(value) -> bool:
    from .errors import TrainerError

    return isinstance(value, TrainerError)


def record_uncaught_failures() -> None:
    """Under ptrain's launcher (``PTRAIN_FAILURE_DIR`` set; ``import trainer`` calls this): a project error
    (``trainer.errors.TrainerError``) the script leaves uncaught, wherever it was raised, is recorded with
    :func:`record_failure` and ends the rank with its code, as an error of ``fit()`` does. No-op elsewhere."""
    if os.environ.get(FAILURE_DIR_ENV):
        _install_hooks()


def record_failure(rank: int, error: BaseException) -> None:
    """Write ``{rank, code, error}`` for ptrain (no-op outside ptrain's launcher; never raises). Should the
    script leave ``error`` uncaught, the rank writes its traceback to ``rank-N.traceback`` beside the record
    instead of on the console, and exits with the error's code."""
    folder = os.environ.get(FAILURE_DIR_ENV)
    if not folder:
        return
    import json

    code = getattr(error, "exit_code", None)
    record = {"rank": rank, "code": code if isinstance(code, int) else 1,
              "error": f"{type(error).__name__}: {error}"[:2000]}
    # left uncaught by the script, the error is then not printed by this rank (its traceback goes to
    # ptrain's log_dir) and the process exits with its code: ptrain prints it once for every rank
    _HANDOFF.update(failure=error, failure_code=record["code"], failure_rank=rank)
    _install_hooks()
    try:
        tmp = os.path.join(folder, f".rank-{rank}.json.tmp-{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(tmp, os.path.join(folder, f"rank-{rank}.json"))
    except OSError:
        pass


def read_failures(folder: str) -> list:
    """The records of :func:`record_failure` in ``folder``, by rank."""
    import json

    found = []
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith("rank-") and n.endswith(".json"))
    except OSError:
        return []
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                found.append(json.load(f))
        except (OSError, ValueError):
            pass
    return sorted(found, key=lambda r: r.get("rank", 0))
