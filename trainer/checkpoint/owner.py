"""Who a process is, and whether it still lives, as far as this process can tell.

A PID alone names a process only inside one PID namespace of one boot of one
host: a container's entry point is PID 1 in its own namespace, a restarted
container is PID 1 again, and a process on another host (or in another
container) may have any PID here. So an owner is recorded as::

    {"host": ..., "boot": ..., "pidns": ..., "pid": ..., "pid_start": ...}

(``boot``: ``/proc/sys/kernel/random/boot_id``; ``pidns``: the inode of
``/proc/self/ns/pid``; ``pid_start``: the process's start time in clock ticks
since boot, field 22 of ``/proc/PID/stat``, which tells a reused PID from the
original). A record is judged by :func:`judge`:

- same host, another boot: stale (the host restarted since);
- the reader shares the owner's host, boot and PID namespace: live exactly when
  that PID exists (not a zombie) and started when the record says, whatever
  the clocks say about its lease (a paused owner, a clock stepped ahead: the
  start time comes from ``/proc``, not from a wall clock);
- anywhere else: its lease (``renewed`` + ``lease`` seconds, renewed by the
  owner's heartbeat) expired: stale; else unknown until the lease either is
  renewed (live) or runs out (stale); the reader waits at most one lease. An
  owner taken over this way while it lives (paused past its lease) is fenced
  out: :mod:`trainer.checkpoint.fence`.

``PTRAIN_LOCK_LEASE_SECONDS`` must be a finite number of seconds from
``MIN_LEASE_SECONDS`` to ``MAX_LEASE_SECONDS``; a record's lease outside that
range (written by an older version: ``Infinity``, ``NaN``) is read as the
default.

Records without a lease (written by older versions) keep the old rule: a PID on
this host is checked, a PID of another host is taken as live.
"""

from __future__ import annotations

import math
import os
import socket
import time
from typing import Optional, Tuple

from ..errors import ConfigError

LEASE_ENV = "PTRAIN_LOCK_LEASE_SECONDS"   # the lease an owner takes (its heartbeat renews it every third of it)
DEFAULT_LEASE_SECONDS = 30.0
MIN_LEASE_SECONDS = 1.0
MAX_LEASE_SECONDS = 86400.0   # a day: a longer lease would keep a dead container's output_dir locked for days

LIVE, STALE, UNKNOWN = "live", "stale", "unknown"


def lease_seconds() -> float:
    """The lease of a new owner record: ``PTRAIN_LOCK_LEASE_SECONDS`` (default 30 s; 1 s to a day)."""
    raw = os.environ.get(LEASE_ENV, "")
    try:
        value = float(raw) if raw.strip() else DEFAULT_LEASE_SECONDS
    except ValueError:
        raise ConfigError(f"{LEASE_ENV}={raw!r} is not a number of seconds: unset it or give e.g. 30") from None
    if not math.isfinite(value) or not MIN_LEASE_SECONDS <= value <= MAX_LEASE_SECONDS:
        raise ConfigError(f"{LEASE_ENV}={raw!r} is not a lease from {MIN_LEASE_SECONDS:g} to {MAX_LEASE_SECONDS:g} "
                          "seconds: unset it (30 s) or give e.g. 30")
    return value


def record_lease(record: dict) -> float:
    """The lease ``record`` holds, in seconds; one that is missing, not finite or out of range: the default."""
    try:
        value = float(record.get("lease", DEFAULT_LEASE_SECONDS))
    except (TypeError, ValueError):
        return DEFAULT_LEASE_SECONDS
    if not math.isfinite(value) or not MIN_LEASE_SECONDS <= value <= MAX_LEASE_SECONDS:
        return DEFAULT_LEASE_SECONDS
    return value


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def boot_id() -> str:
    return _read("/proc/sys/kernel/random/boot_id")


def pid_namespace() -> str:
    """This process's PID namespace (``pid:[4026531836]``), or "" where there is no /proc."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def pid_start(pid: int) -> Optional[int]:
    """When process ``pid`` (of this PID namespace) started, in clock ticks since boot; None if unknown."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat or ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    try:
        return int(fields[19])  # field 22 of stat; fields[0] is field 3 (state)
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists in this process's PID namespace (a zombie does not: it has ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    stat = _read(f"/proc/{pid}/stat")
    return not (")" in stat and stat.rsplit(")", 1)[1].split()[:1] == ["Z"])


def identity() -> dict:
    """This process as an owner record names it."""
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "boot": boot_id(), "pidns": pid_namespace(),
            "pid_start": pid_start(pid)}


def same_namespace(record: dict) -> bool:
    """Whether the reader can check ``record``'s PID: same host, same boot, same PID namespace."""
    me = identity()
    return (record.get("host") == me["host"] and bool(record.get("pidns")) and record.get("pidns") == me["pidns"]
            and record.get("boot", me["boot"]) == me["boot"])


def where(record: dict) -> str:
    """``process 1 on host h`` plus ``(another PID namespace)`` when the reader cannot check that PID."""
    text = f"process {record.get('pid')} on host {record.get('host')}"
    if record.get("host") == socket.gethostname() and record.get("pidns") and not same_namespace(record):
        text += " (another PID namespace: a container)"
    return text


def lease_age(record: dict, now: Optional[float] = None) -> Optional[float]:
    """Seconds since the record's lease was last renewed (None for a record without a lease)."""
    if "lease" not in record:
        return None
    try:
        return (time.time() if now is None else now) - float(record.get("renewed", record.get("started", 0)))
    except (TypeError, ValueError):
        return float("inf")


def judge(record: dict) -> Tuple[str, str]:
    """(LIVE, STALE or UNKNOWN, why) for the owner named by ``record``, as seen by this process."""
    me = identity()
    if record.get("host") == me["host"] and record.get("boot") and me["boot"] and record.get("boot") != me["boot"]:
        return STALE, "the host has restarted since"
    try:
        pid = int(record.get("pid", -1))
    except (TypeError, ValueError):
        return STALE, "its record names no process"
    if same_namespace(record):  # the PID decides, never a wall clock (a paused owner, a clock stepped ahead)
        if not pid_alive(pid):
            return STALE, f"process {pid} is gone"
        started = record.get("pid_start")
        if started is not None and pid_start(pid) not in (None, started):
            return STALE, f"process {pid} is gone (the PID now belongs to another process)"
        return LIVE, f"process {pid} is alive"
    age = lease_age(record)
    if age is not None:
        lease = record_lease(record)
        if age > lease:
            return STALE, f"its lease of {lease:.0f} s expired {age - lease:.0f} s ago"
        return UNKNOWN, f"its lease was renewed {max(age, 0):.0f} s ago"
    if record.get("host") == me["host"]:  # an old record: a PID of this host, checked as before
        return (LIVE, f"process {pid} is alive") if pid_alive(pid) else (STALE, f"process {pid} is gone")
    return LIVE, "it runs on another host"
