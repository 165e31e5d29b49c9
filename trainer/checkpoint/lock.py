"""RunLock: one job owns an output_dir, from the first line of the command to the last.

``output_dir/.ptrain.lock`` is a small JSON record::

    {"job": ..., "run": ..., "token": ..., "multinode": false, "started": ...,
     "pid": ..., "host": ..., "boot": ..., "pidns": ..., "pid_start": ...,
     "lease": 30.0, "renewed": ..., "beat": 0, "generation": 3}

``job`` names the job (every process of one job has the same), ``run`` the
training run (kept when a process of the same job takes the lock over),
``token`` the process that holds it; ``pid`` .. ``pid_start`` say who that is
(:mod:`trainer.checkpoint.owner`), ``lease`` / ``renewed`` / ``beat`` are its
lease: a heartbeat thread of the holder (never the training thread) rewrites the
record every third of the lease; ``generation`` is the fencing token this claim
took (:mod:`trainer.checkpoint.fence`: one above the last, kept in
``output_dir/.ptrain.generation``), checked before every write that publishes
a file. A heartbeat that wakes later than the lease (the process was paused)
says so and re-reads the record: still ours, it renews; taken over, every later
write of this process into output_dir is refused (exit 7). A renewal that fails
(a full disk, an immutable lock file, a read-only directory) is one warning naming
the OS error, repeated only as the failures go on (failed attempts 1, 2, 4, 8, ...,
then at most hourly). The record is written to a temporary file
first and then hard-linked (created) or renamed (renewed, taken over) into
place, so the lock never exists empty or half written and two racers cannot
both create it; on one host, acquiring, renewing and releasing also hold
``flock`` on output_dir, so no racer reads a lock while another replaces it.

Who holds it:

- ``ptrain run`` holds it for the whole command (:func:`hold_for_command`) and
  exports the job's identity as ``PTRAIN_JOB_ID`` and the holder's token as
  ``PTRAIN_LOCK_OWNER`` before it starts the launcher, so the launched ranks and
  their restarts recognise their own launch and never refuse themselves;
- ``Trainer.fit()`` on rank 0 acquires it when no process of its job holds it
  (a plain script, or a raw ``python -m paddle.distributed.launch``); other
  ranks never probe it.

A lock whose owner is stale (:func:`trainer.checkpoint.owner.judge`: its process
is gone, its host restarted; from another namespace or host: its lease expired)
is taken over with a warning; a live PID in this PID namespace never is.
An owner this process cannot check (another host, another container) is waited
for, at most the rest of its lease: renewed meanwhile, it is live and a second
job is refused; not renewed, it is stale (a restarted container takes its own
earlier lock over this way, and says so). One job id has one owner at a time: a
second command of the same job is refused like another job unless it is a rank
or a restart of the owner's launch (``PTRAIN_LOCK_OWNER``) or a node of the same
multi-node job; the new rank 0 of the job, on another node after an elastic
restart, takes the lock over keeping its run. ``release`` removes the lock only
while it is still ours.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import threading
import time
import uuid
from typing import Iterator, Optional

from ..errors import ConfigError, option
from ..heap import start_waiting_thread
from . import fence
from .fence import LOCK_NAME
from .owner import (LIVE, STALE, UNKNOWN, identity, judge, lease_age, lease_seconds, pid_alive, record_lease,
                    same_namespace, where)

__all__ = ["LOCK_NAME", "JOB_ENV", "OWNER_ENV", "RunLock", "job_key", "pid_alive", "hold_for_command", "holder"]

logger = logging.getLogger("trainer.lock")
JOB_ENV = "PTRAIN_JOB_ID"          # the job's identity, exported by ptrain to the launcher and its ranks
OWNER_ENV = "PTRAIN_LOCK_OWNER"    # the holder's token, exported with it: its ranks and restarts share the lock
UNREADABLE_GRACE_SECONDS = 60.0     # an unreadable lock older than this is taken as left by a crash
POLL_SECONDS = 0.25                 # how often a waiter re-reads a lock it cannot check


def job_key(job_id: Optional[str] = None, master: Optional[str] = None, ips: Optional[str] = None) -> str:
    """The identity of the job this command starts (the same on every node of one job).

    ``job_id`` (``--job_id`` / ``PADDLE_JOB_ID``) when given; else a multi-node
    job's master or node list, which every node is given alike; else a fresh id.
    """
    job_id = job_id or os.environ.get("PADDLE_JOB_ID")
    if job_id:
        return f"job:{job_id}"
    if master:
        return f"master:{master}"
    if ips and "," in ips:
        return f"ips:{ips}"
    return f"run:{uuid.uuid4().hex}"


def _fail(output_dir: str, path: str, exc: OSError) -> ConfigError:
    if exc.errno == errno.ENOSPC:
        return ConfigError(f"output_dir {output_dir} is full: writing {path} failed (No space left on device): "
                           f"free space or choose another {option('output_dir')}")
    return ConfigError(f"output_dir {output_dir} cannot be written ({path}: {exc.strerror}): "
                       f"choose a writable {option('output_dir')}")


def _since(record: dict) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(record.get("started", 0) or 0)))


class RunLock:
    """The lock of one output_dir, for the job ``job`` (default: ``PTRAIN_JOB_ID``, else this process alone).

    ``multinode``: this command is one node of a multi-node job, whose other nodes share the lock.
    """

    def __init__(self, output_dir: str, job: Optional[str] = None, multinode: bool = False):
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, LOCK_NAME)
        self.job = job or os.environ.get(JOB_ENV) or f"run:{uuid.uuid4().hex}"
        self.multinode = multinode
        self.token = uuid.uuid4().hex
        self.held = False        # we created (or took over) the lock and must remove it
        self.record: dict = {}   # the lock's record while we hold or share it
        self._heartbeat: Optional[_Heartbeat] = None
        self._generation: Optional[int] = None  # the generation held in trainer.checkpoint.fence

    @property
    def run_id(self) -> str:
        """The run this lock belongs to (shared by every process of the job)."""
        return str(self.record.get("run", ""))

    # ---- acquire ------------------------------------------------------------------
    def acquire(self, take_over_same_job: bool = False) -> "RunLock":
        """Own the lock, or share it with a live process of the same launch or multi-node job.

        ``take_over_same_job``: a lock of this job whose holder is gone, or runs where this process
        cannot check it (another node), becomes ours (the new rank 0 after an elastic restart).
        """
        created = not os.path.isdir(self.output_dir)
        try:
            os.makedirs(self.output_dir, exist_ok=True)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise _fail(self.output_dir, self.output_dir, exc) from None
            raise ConfigError(f"output_dir {self.output_dir} cannot be created ({exc.strerror}): "
                              f"choose a writable {option('output_dir')}") from None
        try:
            self._acquire(take_over_same_job)
        except ConfigError:
            if created:  # leave nothing behind: not even the directory this attempt made
                with contextlib.suppress(OSError):
                    os.rmdir(self.output_dir)
            raise
        self._generation = fence.hold(self.output_dir, self.record)
        if self.held:
            self._heartbeat = start_waiting_thread(_Heartbeat(self))
        return self

    def _acquire(self, take_over_same_job: bool) -> None:
        expired = None  # the (token, beat) of a record we watched through the rest of its lease, unrenewed
        for _ in range(5):
            with self._guard():
                if self._create(run=uuid.uuid4().hex):
                    return
                owner = self._read()
                if owner is None:
                    continue  # vanished between our link and our read: try again
                verdict, why = judge(owner) if not owner.get("unreadable") else (UNKNOWN, "")
                if expired is not None and expired == _beat(owner):
                    verdict, why = STALE, f"it did not renew its lease of {record_lease(owner):.0f} s"
                if self._settle(owner, verdict, why, take_over_same_job):
                    return
            expired = self._wait_for_lease(owner)
        raise ConfigError(f"could not lock output_dir {self.output_dir}: another run keeps taking it")

    def _settle(self, owner: dict, verdict: str, why: str, take_over_same_job: bool) -> bool:
        """Share, take over or refuse ``owner``'s lock (under the guard); False: wait for its lease first."""
        if owner.get("unreadable"):
            self._refuse_unreadable()
            self._replace(owner, run=uuid.uuid4().hex)
            return True
        if owner.get("job") == self.job:
            if take_over_same_job and (verdict == STALE or not _checkable(owner)):
                self._replace(owner, run=str(owner.get("run", "")))
                logger.warning("rank 0 of job %s takes over the lock of %s from %s", self.job, self.output_dir,
                               where(owner))
                return True
            launched = os.environ.get(OWNER_ENV) == owner.get("token")
            if launched or (self.multinode and owner.get("multinode")):
                self.record = owner  # our own launch or another node of our job holds it: share, never remove
                return True
        if verdict == UNKNOWN:
            return False
        if verdict == LIVE:
            self._refuse_live(owner, why)
        run = str(owner.get("run", "")) if owner.get("job") == self.job else uuid.uuid4().hex
        self._replace(owner, run=run)
        logger.warning("taking over the lock of %s from %s: %s", self.output_dir, where(owner), why)
        return True

    def _refuse_live(self, owner: dict, why: str) -> None:
        if owner.get("job") == self.job:
            raise ConfigError(f"output_dir {self.output_dir} is in use by another command of the same job "
                              f"{self.job.split(':', 1)[-1]} ({where(owner)} since {_since(owner)}; {why}): one "
                              "command of a job owns an output_dir at a time: wait for it to finish, give this "
                              f"command another {option('job_id')}, or use another {option('output_dir')}")
        pid, host = owner.get("pid"), owner.get("host")
        if "lease" not in owner and host != identity()["host"]:
            raise ConfigError(f"output_dir {self.output_dir} is in use by process {pid} on host {host} "
                              f"(lock {self.path}): wait for that run, use another {option('output_dir')}, or delete the "
                              "lock file if that run is gone")
        if same_namespace(owner) or "lease" not in owner:
            raise ConfigError(f"output_dir {self.output_dir} is in use by live process {pid} on {host} since "
                              f"{_since(owner)}: wait for it to finish or use another {option('output_dir')}")
        raise ConfigError(f"output_dir {self.output_dir} is in use by {where(owner)} since {_since(owner)} ({why}): "
                          f"wait for it to finish or use another {option('output_dir')}")

    def _refuse_unreadable(self) -> None:
        try:
            age = time.time() - os.path.getmtime(self.path)
        except OSError:
            age = 0.0
        if age < UNREADABLE_GRACE_SECONDS:
            raise ConfigError(f"the lock {self.path} is unreadable: if no run uses {self.output_dir}, "
                              "delete it and run again")
        logger.warning("taking over the unreadable lock of %s (%.0f s old)", self.output_dir, age)

    def _wait_for_lease(self, owner: dict) -> Optional[tuple]:
        """Watch a lock whose holder cannot be checked from here (outside the guard, so it can renew).

        Returns its (token, beat) when the rest of its lease passed without a renewal; refuses when it
        was renewed (the holder lives); None when it changed otherwise (released, taken): decide again.
        """
        lease = record_lease(owner)
        rest = min(max(lease - max(lease_age(owner) or 0.0, 0.0), 0.0), lease) + POLL_SECONDS
        logger.warning("output_dir %s is locked by %s, which this process cannot check; %s: waiting up to %.0f s "
                       "for its lease to run out (a restarted container's earlier self) or be renewed (a live run)",
                       self.output_dir, where(owner), judge(owner)[1], rest)
        seen = _beat(owner)
        deadline = time.monotonic() + rest
        while time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            try:
                now = self._read()
            except ConfigError:
                return None
            if now is None or now.get("token") != owner.get("token"):
                return None
            if _beat(now) != seen:
                self._refuse_live(now, f"it renewed its lease {max(lease_age(now) or 0.0, 0.0):.0f} s ago")
        return seen

    def _record(self, run: str, generation: int) -> dict:
        now = time.time()
        return {"job": self.job, "run": run, "token": self.token, "multinode": self.multinode, "started": now,
                **identity(), "lease": lease_seconds(), "renewed": now, "beat": 0, "generation": generation}

    def _write_temp(self, record: dict) -> str:
        """``record`` in a complete, fsynced temporary file next to the lock (its path); the OSError when the disk
        refuses, the temporary removed."""
        tmp = f"{self.path}.tmp-{self.token}"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            _remove(tmp)
            raise
        return tmp

    def _put(self, record: dict, place) -> bool:
        """Write ``record`` to a temporary file and ``place(tmp)`` it as the lock (link or replace); ours unless
        ``place`` returns False (a lock exists). An OSError is the one ConfigError of :func:`_fail`."""
        try:
            tmp = self._write_temp(record)
        except OSError as exc:
            raise _fail(self.output_dir, self.path, exc) from None
        try:
            if place(tmp) is False:
                return False
        except OSError as exc:
            raise _fail(self.output_dir, self.path, exc) from None
        finally:
            _remove(tmp)
        self.record, self.held = record, True
        fence.commit_generation(self.output_dir, record["generation"])
        return True

    def _create(self, run: str) -> bool:
        """Link a complete record into place; False when a lock exists."""
        def link(tmp: str) -> bool:
            try:
                os.link(tmp, self.path)  # atomic, fails when the lock exists (also on NFS)
            except FileExistsError:
                return False
            return True

        return self._put(self._record(run, fence.next_generation(self.output_dir)), link)

    def _replace(self, owner: dict, run: str) -> None:
        """Swap the lock ``owner`` holds for ours (under the guard; never leaves no lock in between)."""
        def swap(tmp: str) -> None:
            if self._read() != owner:
                raise ConfigError(f"could not lock output_dir {self.output_dir}: another run took it just now")
            os.replace(tmp, self.path)

        self._put(self._record(run, fence.next_generation(self.output_dir, owner)), swap)

    def _read(self) -> Optional[dict]:
        """The lock's record; None when there is no lock."""
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read(65536)
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise ConfigError(f"{self.path} is a directory, not a lock file: remove it (rm -r {self.path}) "
                              f"or choose another {option('output_dir')}") from None
        except OSError as exc:
            raise ConfigError(f"the lock {self.path} cannot be read ({exc.strerror}): "
                              f"choose another {option('output_dir')}") from None
        try:
            owner = json.loads(text)
            int(owner["pid"]), str(owner["host"])
            return owner
        except (ValueError, KeyError, TypeError):
            return {"unreadable": True}

    # ---- lease --------------------------------------------------------------------
    def renew(self) -> bool:
        """Renew our lease (the heartbeat thread); False once the lock is no longer ours. The OSError when the
        record cannot be rewritten (a full disk, an immutable lock file, a read-only directory); ConfigError when
        the lock cannot be read."""
        with self._guard():
            owner = self._read()
            if owner is None or owner.get("token") != self.token:
                if owner is not None:
                    fence.mark_lost(self.output_dir, fence.lost_line(
                        self.output_dir, int(self.record.get("generation") or 0), owner,
                        int(owner.get("generation") or 0)))
                return False
            record = dict(self.record, renewed=time.time(), beat=int(self.record.get("beat", 0)) + 1)
            tmp = self._write_temp(record)
            try:
                os.replace(tmp, self.path)
            except OSError:
                _remove(tmp)
                raise
            self.record = record
            return True

    # ---- release --------------------------------------------------------------------
    def release(self) -> None:
        """Remove the lock if it is still ours (never one another run holds now)."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        fence.drop(self.output_dir, self._generation)
        self._generation = None
        if not self.held:
            return
        self.held = False
        try:
            with self._guard():
                owner = self._read()
                if owner is not None and owner.get("token") == self.token:
                    _remove(self.path)
                elif owner is not None:
                    log = logger.info if owner.get("job") == self.job else logger.warning  # same job: a handover
                    log("the lock of %s is no longer ours (now %s): left in place", self.output_dir, where(owner))
        except (OSError, ConfigError) as exc:
            logger.warning("could not release the lock %s: %s", self.path, exc)

    def _guard(self):
        """``flock`` on output_dir (:func:`trainer.checkpoint.fence.guard`): racers on this host take turns."""
        return fence.guard(self.output_dir)


class _Heartbeat(threading.Thread):
    """Renews the holder's lease every third of it, off the training thread, until stopped or no longer ours.

    A renewal that fails (a full disk, an immutable lock file, a read-only directory) is retried at every beat
    and said in one warning naming the OS error, repeated only at failed attempts 2, 4, 8, ... (the interval
    doubles) and at most every :data:`WARN_AT_MOST_EVERY_S` seconds' worth of beats after that; a renewal that
    works again says so once. "was this process paused?" is said only when this thread itself did not run for
    longer than the lease (SIGSTOP, a suspended VM): the time since its previous attempt, not since the last
    renewal that worked.
    """

    def __init__(self, lock: RunLock):
        super().__init__(name="ptrain-lock-lease", daemon=True)
        self.lock = lock
        self._halt = threading.Event()
        self.failed = 0  # renewals failed in a row

    def run(self) -> None:
        lease = record_lease(self.lock.record)
        beat = lease / 3.0
        last_try = renewed = _uptime()
        while not self._halt.wait(beat):
            now = _uptime()
            if now - last_try > lease:  # this thread did not run for longer than the lease: others may have taken over
                logger.warning("the lease of %s was not renewed for %.0f s (more than its %.0f s; was this process "
                               "paused?): checking that the lock is still ours", self.lock.output_dir, now - renewed,
                               lease)
            try:
                if not self.lock.renew():
                    return
                if self.failed:
                    logger.warning("renewed the lease of %s again, after %d failed attempt(s) over %.0f s",
                                   self.lock.path, self.failed, now - renewed)
                self.failed, renewed = 0, _uptime()
            except (OSError, ConfigError) as exc:
                self.failed += 1
                self._warn_failure(exc, now - renewed, lease, beat)
            last_try = _uptime()

    def _warn_failure(self, exc: Exception, unrenewed: float, lease: float, beat: float) -> None:
        n, cap = self.failed, max(1, int(WARN_AT_MOST_EVERY_S / beat))
        if not _warned_at(n, cap):
            return
        cause = _os_cause(exc) if isinstance(exc, OSError) else str(exc)
        again = next(m for m in range(n + 1, n + cap + 1) if _warned_at(m, cap))
        logger.warning("could not renew the lease of %s (attempt %d, every %.0f s; last renewed %.0f s ago): %s; "
                       "once its %.0f s lease has run out other runs may take output_dir over; next warning at "
                       "attempt %d if it still fails", self.lock.path, n, beat, unrenewed, cause, lease, again)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5)


#: after the doubling (failed attempts 1, 2, 4, ...), a renewal that keeps failing is warned about at most this often
WARN_AT_MOST_EVERY_S = 3600.0


def _warned_at(attempt: int, cap: int) -> bool:
    """Whether failed renewal ``attempt`` is warned about: 1, 2, 4, ... up to ``cap`` attempts, then every ``cap``."""
    return (attempt & (attempt - 1) == 0 and attempt <= cap) or attempt % cap == 0


def _os_cause(exc: OSError) -> str:
    """``[Errno 1] Operation not permitted: A -> B``: the OS error of a failed renewal and the files it was about."""
    files = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    what = f"[Errno {exc.errno}] {exc.strerror}" if exc.errno is not None else str(exc)
    return f"{what}: {files}" if files else what


def _uptime() -> float:
    """A clock no wall-clock step moves, which also counts a suspended machine's sleep (CLOCK_BOOTTIME)."""
    return time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))


def _checkable(record: dict) -> bool:
    """Whether this process can check the record's PID (an old record without a namespace: same host)."""
    return same_namespace(record) if record.get("pidns") else record.get("host") == identity()["host"]


def _beat(record: dict) -> tuple:
    return record.get("token"), record.get("beat"), record.get("renewed")


def holder(output_dir: str) -> Optional[dict]:
    """The record of the live (lease not expired) holder of ``output_dir``'s lock, else None."""
    record = fence.read_record(output_dir)
    if record is None or judge(record)[0] == STALE:
        return None
    return record


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError:
        pass


@contextlib.contextmanager
def hold_for_command(output_dir: str, job: str, multinode: bool = False) -> Iterator[RunLock]:
    """Hold the lock of ``output_dir`` for ``job`` around a whole command.

    Exports ``PTRAIN_JOB_ID=job`` and ``PTRAIN_LOCK_OWNER`` (the holder's token) so that the processes
    this command starts (the launcher, its ranks, their restarts) share the lock instead of refusing
    themselves. Used by ``ptrain run``; the lock is removed at the end if ours.
    """
    lock = RunLock(output_dir, job=job, multinode=multinode).acquire()
    previous = {name: os.environ.get(name) for name in (JOB_ENV, OWNER_ENV)}
    os.environ[JOB_ENV] = job
    os.environ[OWNER_ENV] = str(lock.record.get("token", lock.token))
    try:
        yield lock
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        lock.release()
