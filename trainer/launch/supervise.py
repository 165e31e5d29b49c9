"""Supervise ``paddle.distributed.launch``: ``ptrain`` forwards signals to the job and
never leaves a process of it behind.

``run_launcher(cmd)`` starts the launcher

- in its own process group (a Ctrl-C in the terminal or a SIGTERM to
  ``ptrain``'s group reaches ``ptrain`` alone, which decides what the job gets);
- with a parent-death signal (SIGTERM when ``ptrain`` dies, even by SIGKILL:
  the launcher then stops its workers, which save and exit 143);
- with its stdout and stderr on one pipe that ``ptrain`` relays to its console and to
  ``LOG_DIR/console.log`` (``trainer.launch.relay``): the launcher never writes into a closed
  console, and ``ptrain`` learns which rank it saw failing first, with its code.

The signal handler only records the signal and forwards it; the line that announces it is printed by
the loop that waits for the job (a write from a handler could meet a closed pipe, or interrupt another
write of the same stream).

SIGTERM, SIGINT, SIGHUP (forwarded as SIGTERM) or SIGUSR1 to ``ptrain``
(Kubernetes sends SIGTERM to PID 1, Slurm ``--signal=USR1@N``) is forwarded
to the training processes (the launcher's children) rather than to the
launcher: each rank stops at the agreed step, saves, exits 143 / 130, and
the launcher, seeing a rank end with that code, exits with it too (paddle's
launcher exits with its own signal number, 15 or 2, when it is signalled
itself). Before the workers exist the launcher gets the signal (SIGTERM for
SIGUSR1, which paddle's launcher does not handle). ``ptrain``
then waits: if the job has not ended ``PTRAIN_STOP_SECONDS`` (default 330 s,
past the ranks' own bounds) after the signal, the launcher gets SIGTERM (it
stops its workers, SIGKILL after its 30 s), and 40 s later every process of
the job gets SIGKILL. When the launcher has ended, any process of the job
still alive (workers orphaned by a SIGKILLed launcher finish their save
first) gets the same bound, then SIGKILL.

Exit code: after ``ptrain`` received SIGTERM or SIGHUP / SIGINT / SIGUSR1, 143 /
130 / 138 unless the job still ended with 0 (so ``--max_restarts`` never
restarts a job that was told to stop). Otherwise the launcher's: a death by
signal N is reported as 128 + N (paddle's launcher passes a rank's death by
signal N on as 256 - N, e.g. 247 for SIGKILL: reported as 137 too), and
paddle's own 15 (the launcher itself was sent SIGTERM) as 143. A rank that died of SIGTERM without
``ptrain`` being signalled was stopped by the launcher after another rank failed (paddle reports the first
rank's code only): 1, restartable, or the code the failed rank recorded (``trainer.launch.restarts``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from typing import Dict, List, NamedTuple, Optional, Tuple

import psutil

from ..process import (
    STOP_SIGNALS,
    catch,
    set_parent_death_signal,
    startup_handlers_active,
    stop_signal,
)
from .relay import ConsoleLog, Relay

logger = logging.getLogger("trainer.supervise")

FORWARDED = STOP_SIGNALS  # SIGHUP is forwarded as SIGTERM
#: the job's code when paddle's launcher stopped the ranks because one of them failed (restartable; the failed rank's
#: recorded error names it, trainer.launch.restarts)
STOPPED_AFTER_FAILURE = 1
ESCALATE_AFTER_LAUNCHER_SIGTERM = 40.0  # the launcher's own pod.stop waits 30 s before SIGKILL


def stop_seconds() -> float:
    try:
        return float(os.environ.get("PTRAIN_STOP_SECONDS", 330))
    except ValueError:
        return 330.0


def _child_setup() -> None:  # runs in the child between fork and exec
    os.setpgrp()
    set_parent_death_signal(signal.SIGTERM)


class _Supervisor:
    def __init__(self, proc: subprocess.Popen, log: Optional[ConsoleLog] = None):
        self.proc, self.log = proc, log or ConsoleLog(None)
        self.signum: Optional[int] = None
        self.received: Optional[int] = None  # the signal as received, announced by wait() (never in the handler)
        self.signal_time: Optional[float] = None
        self.escalated: Optional[float] = None
        self.known: Dict[int, float] = {}  # pid -> create_time of every process of the job seen

    # ---- signals ------------------------------------------------------------------
    def on_signal(self, signum, frame) -> None:
        # no output here: a write interrupted by this handler, or one into a closed pipe (the reader of
        # `ptrain ... | tee` got the same Ctrl-C), must not stop the forwarding; wait() announces it
        received, signum = signum, stop_signal(signum)
        if self.signum is None:
            self.signum, self.signal_time, self.received = signum, time.monotonic(), received
        self.forward(signum)

    def _announce(self) -> None:
        if self.received is not None:
            received, self.received = self.received, None
            self.log.say(f"ptrain: {signal.Signals(received).name}: stopping the job (each rank saves and exits); "
                         f"waiting up to {stop_seconds():.0f} s")

    def forward(self, signum: int) -> None:
        workers = self._children()
        targets = workers or [self.proc.pid]
        if not workers and signum not in (signal.SIGTERM, signal.SIGINT):
            signum = signal.SIGTERM  # paddle's launcher handles only these (SIGUSR1 would kill it outright)
        for pid in targets:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def _children(self) -> List[int]:
        try:
            return [c.pid for c in psutil.Process(self.proc.pid).children(recursive=False)]
        except psutil.Error:
            return []

    def _track(self) -> None:
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                try:
                    self.known.setdefault(child.pid, child.create_time())
                except psutil.Error:
                    pass
        except psutil.Error:
            pass

    # ---- waiting ------------------------------------------------------------------
    def wait(self) -> int:
        while True:
            self._announce()
            try:
                return self.proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            self._track()
            if self.signal_time is None:
                continue
            now = time.monotonic()
            if self.escalated is None and now - self.signal_time > stop_seconds():
                self.log.say("ptrain: the job did not stop in time: SIGTERM to the launcher")
                self.escalated = now
                self._signal_launcher(signal.SIGTERM)
            elif self.escalated is not None and now - self.escalated > ESCALATE_AFTER_LAUNCHER_SIGTERM:
                self.log.say("ptrain: the job still runs: SIGKILL to every process of it")
                self._kill_all()

    def _signal_launcher(self, signum: int) -> None:
        try:
            self.proc.send_signal(signum)
        except ProcessLookupError:
            pass

    def _alive(self) -> List[psutil.Process]:
        alive = []
        for pid, created in self.known.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                pass
        return alive

    def _kill_all(self) -> None:
        self._track()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for p in self._alive():
            try:
                p.kill()
            except psutil.Error:
                pass

    def reap(self) -> None:
        """After the launcher ended: what is left of the job gets the bound, then SIGKILL."""
        deadline = time.monotonic() + stop_seconds()
        left = self._alive()
        if left:
            self.log.say(f"ptrain: the launcher ended; waiting for {len(left)} process(es) of the job: "
                         f"{', '.join(str(p.pid) for p in left)}")
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = self._alive()
        if left:
            self._kill_all()

    def exit_code(self, code: int) -> int:
        if self.signum is not None and code != 0:  # told to stop: never a failure to restart from
            return 128 + self.signum
        if code < 0:  # the launcher died of a signal
            code = 128 - code
        elif code == 256 - signal.SIGTERM:
            # the first rank in rank order died of SIGTERM, which only paddle's launcher sends it (our ranks turn a
            # SIGTERM from anywhere else into a save and exit 143): another rank failed first (a crashed pipeline
            # stage, a dead data-parallel rank) and the launcher stopped the rest: a failure a restart may fix
            # (trainer.launch.restarts then looks at what that rank recorded, or the code the launcher logged for it)
            code = STOPPED_AFTER_FAILURE
        elif 256 - 64 <= code < 256:  # paddle's launcher: sys.exit(a rank's returncode -N) is 256 - N
            code = 128 + (256 - code)
        if code == signal.SIGTERM:  # paddle's launcher, signalled itself, exits with the signal number
            code = 128 + signal.SIGTERM
        return code


class LauncherEnd(NamedTuple):
    code: int  #: the job's exit code (see the module docstring)
    first_failed: Optional[Tuple[int, int]]  #: (rank, exit code) of the rank the launcher saw failing first


def run_launcher(cmd: List[str], env: Optional[dict] = None, log: Optional[ConsoleLog] = None,
                 quiet: bool = True) -> LauncherEnd:
    """Run the launcher command ``cmd`` under supervision; return how the job ended. Its output goes to the
    console and ``log`` (``trainer.launch.relay``; ``quiet`` False shows even the lines kept off a quiet console)."""
    log = log or ConsoleLog(None)  # the console only
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")  # its lines reach the console as printed
    proc = subprocess.Popen(cmd, env=env, preexec_fn=_child_setup, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    relay = Relay(proc.stdout.fileno(), log, quiet)
    relay.start()
    sup = _Supervisor(proc, log)
    previous = {}
    startup_exit = startup_handlers_active(False)  # ptrain waits for the job instead
    if threading.current_thread() is threading.main_thread():
        previous = catch(FORWARDED, sup.on_signal)  # nohup's SIGHUP stays ignored
    try:
        code = sup.wait()
    except BaseException:
        sup._kill_all()
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        startup_handlers_active(startup_exit)
    relay.join(timeout=5)  # the launcher's last lines (its pipe closes when it exits)
    proc.stdout.close()
    sup._announce()
    sup.reap()
    return LauncherEnd(sup.exit_code(code), relay.first_failure)
