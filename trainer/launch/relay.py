"""The job's console: what paddle's launcher prints, and ``ptrain``'s own lines, shown on ``ptrain``'s console and
kept in ``LOG_DIR/console.log``.

The launcher does not write to ``ptrain``'s terminal itself: its stdout and stderr are one pipe that ``ptrain``
reads (:class:`Relay`, a thread), so that

- nothing the job prints is lost when the console is a closed pipe (``ptrain launch ... | tee log`` after a
  Ctrl-C killed ``tee``, ``| head -1``): every byte goes to ``console.log`` first, then to the console, whose
  writes never raise (``trainer.process.guard_console``); the launcher itself never meets a closed pipe, which
  made its last flush fail (Python's exit code 120, read as a failure) and its signal handler lose lines;
- the launcher's "LAUNCH ERROR ... Container failed !!!" block after a rank ended with a preemption's code
  (130, 138, 143), and the tail of that rank's log it repeats after it, stay off the console (they are in
  ``console.log``): a preemption is not a failure, and ``ptrain``'s closing line says what is on disk;
- the first rank the launcher saw failing, with its own exit code, reaches the supervisor
  (:attr:`Relay.first_failure`): paddle's launcher exits with the code of the first rank in rank order, which is
  rank 0's SIGTERM when rank 1 failed first and the launcher stopped rank 0.

``ptrain``'s own lines go through :meth:`ConsoleLog.say`: stderr and ``console.log``, never an exception.
"""

from __future__ import annotations

import codecs
import os
import re
import sys
import threading

# a preempted rank's "Container failed" from the launcher is no failure
from ..process import PREEMPTED_CODES

CONSOLE_LOG = "console.log"
_FAILED = re.compile(r"^LAUNCH ERROR .*Container failed !!!\s*$")
_CONTAINER = re.compile(r"^Container rank (\d+) status failed cmd .* code (-?\d+) log (\S+)\s*$")
_HELD_PREFIXES = ("LAUNCH ERROR", "Container rank")
_OWN_PREFIXES = ("LAUNCH ", "ptrain: ")  # the launcher's log lines, the etcd wrapper's (trainer/launch/elastic.py)


class ConsoleLog:
    """``LOG_DIR/console.log``, appended to, and the console: one place for every line of a launched job."""

    def __init__(self, log_dir: str | None):
        self.path = os.path.join(log_dir, CONSOLE_LOG) if log_dir else None
        self._lock = threading.Lock()
        self._file = None
        if self.path:
            try:
                os.makedirs(log_dir, exist_ok=True)
                self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - closed by close()
            except OSError:
                self.path = None

    def keep(self, data: bytes) -> None:
        """Into ``console.log`` only."""
        if self._file is not None and data:
            with self._lock:
                try:
                    self._file.write(data)
                except OSError:
                    pass

    def show(self, text: str, stream=None) -> None:
        """On the console only (a closed console is not an error)."""
        stream = stream or sys.stdout
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            pass

    def say(self, line: str) -> None:
        """One of ``ptrain``'s own lines: ``console.log`` and stderr."""
        text = line.rstrip("\n") + "\n"
        self.keep(text.encode("utf-8", "replace"))
        self.show(text, sys.stderr)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class Relay(threading.Thread):
    """Copies the launcher's output (one pipe, ``fd``) to ``console.log`` and the console, as it comes: partial
    lines (a progress bar's ``\\r`` updates) at once, except the launcher's own failure block, held until it is
    complete and shown unless it names a preemption's code."""

    def __init__(self, fd: int, log: ConsoleLog, quiet: bool = True):
        super().__init__(name="ptrain-launcher-output", daemon=True)
        self.fd, self.log, self.quiet = fd, log, quiet  # quiet False (--verbose): every line is shown
        self.first_failure: tuple[int, int] | None = None  # (rank, exit code) the launcher saw failing first
        self.preempted_block = False  # a "Container failed" of a preempted rank was kept off the console
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = ""  # the start of a line that may open the launcher's failure block
        self._held = None  # "LAUNCH ERROR ... Container failed !!!": waits for its "Container rank" line
        self._quiet = False  # after a preempted rank's block: the launcher's repeat of its log's tail

    def run(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                data = b""
            if not data:
                break
            self.log.keep(data)
            self._feed(self._decoder.decode(data))
        self._feed(self._decoder.decode(b"", final=True) + "\n" if self._pending else "")
        if self._held:
            self.log.show(self._held)

    def _feed(self, text: str) -> None:
        text, self._pending = self._pending + text, ""
        out, err = [], []  # the launcher's and ptrain's own lines to stderr, as before the relay; the rest to stdout
        for line in text.splitlines(keepends=True):
            if not line.endswith(("\n", "\r")):  # the last piece, not a complete line yet
                if line.startswith(_HELD_PREFIXES + _OWN_PREFIXES) or any(p.startswith(line) for p in _HELD_PREFIXES
                                                                          + _OWN_PREFIXES):
                    self._pending = line
                elif not self._quiet:
                    out.append(line)
                continue
            shown = self._line(line)
            if shown.startswith(_HELD_PREFIXES + _OWN_PREFIXES):
                if out:
                    self.log.show("".join(out))
                    out = []
                err.append(shown)
            else:
                if err:
                    self.log.show("".join(err), sys.stderr)
                    err = []
                out.append(shown)
        if out:
            self.log.show("".join(out))
        if err:
            self.log.show("".join(err), sys.stderr)

    def _line(self, line: str) -> str:
        if self._held is not None:
            held, self._held = self._held, None
            found = _CONTAINER.match(line)
            if found is None:
                return held + self._line(line)
            rank, code = int(found.group(1)), int(found.group(2))
            if self.first_failure is None:
                self.first_failure = (rank, code)
            if code in PREEMPTED_CODES and self.quiet:
                self.preempted_block = self._quiet = True
                return ""
            return held + line
        if _FAILED.match(line):
            self._held = line
            return ""
        return "" if self._quiet else line
