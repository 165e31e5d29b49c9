"""RunLock: one job owns an output_dir, from the first line of the command to the last.

``output_dir/.ptrain.lock`` is a small JSON record::

    {"job": ..., "run": ..., "token": ..., "pid": ..., "host": ..., "started": ...}

``job`` names the job (every process of one job has the same), ``run`` the
training run (kept when a process of the same job takes the lock over),
``token`` the process that holds it. The record is written to a temporary file
first and then hard-linked into place, so the lock never exists empty or half
written and two racers cannot both create it; on one host, acquiring and
releasing also hold ``flock`` on output_dir, so no racer reads a lock while
another replaces it.

Who holds it:

- ``ptrain run`` holds it for the whole command (:func:`hold_for_command`) and
  exports the job's identity as ``PTRAIN_JOB_ID`` before it starts the
  launcher, so the launched ranks and their restarts recognise their own job
  and never refuse themselves;
- ``Trainer.fit()`` on rank 0 acquires it when no process of its job holds it
  (a plain script, or a raw ``python -m paddle.distributed.launch``); other
  ranks never probe it.

A second job is refused while the owner lives. A lock left by a dead process
on this host is taken over with a warning. A lock of another host is never
guessed away, except by the same job (an elastic restart whose new rank 0 runs
on another node). ``release`` removes the lock only while it is still ours.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
import uuid
from typing import Iterator, Optional

from ..errors import ConfigError

logger = logging.getLogger("trainer.lock")
LOCK_NAME = ".ptrain.lock"
JOB_ENV = "PTRAIN_JOB_ID"          # the job's identity, exported by ptrain to the launcher and its ranks
UNREADABLE_GRACE_SECONDS = 60.0     # an unreadable lock older than this is taken as left by a crash


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
                           "free space or choose another --output_dir")
    return ConfigError(f"output_dir {output_dir} cannot be written ({path}: {exc.strerror}): "
                       "choose a writable --output_dir")


class RunLock:
    """The lock of one output_dir, for the job ``job`` (default: ``PTRAIN_JOB_ID``, else this process alone)."""

    def __init__(self, output_dir: str, job: Optional[str] = None):
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, LOCK_NAME)
        self.job = job or os.environ.get(JOB_ENV) or f"run:{uuid.uuid4().hex}"
        self.token = uuid.uuid4().hex
        self.held = False        # we created (or took over) the lock and must remove it
        self.record: dict = {}   # the lock's record while we hold or share it

    @property
    def run_id(self) -> str:
        """The run this lock belongs to (shared by every process of the job)."""
        return str(self.record.get("run", ""))

    # ---- acquire ------------------------------------------------------------------
    def acquire(self, take_over_same_job: bool = False) -> "RunLock":
        """Own the lock, or share it with a live process of the same job.

        ``take_over_same_job``: a lock of this job whose holder is on another
        host or dead becomes ours (the new rank 0 after an elastic restart).
        """
        created = not os.path.isdir(self.output_dir)
        try:
            os.makedirs(self.output_dir, exist_ok=True)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise _fail(self.output_dir, self.output_dir, exc) from None
            raise ConfigError(f"output_dir {self.output_dir} cannot be created ({exc.strerror}): "
                              "choose a writable --output_dir") from None
        try:
            return self._acquire(take_over_same_job)
        except ConfigError:
            if created:  # leave nothing behind: not even the directory this attempt made
                with contextlib.suppress(OSError):
                    os.rmdir(self.output_dir)
            raise

    def _acquire(self, take_over_same_job: bool) -> "RunLock":
        with self._guard():
            for _ in range(3):
                if self._create(run=uuid.uuid4().hex):
                    return self
                owner = self._read()
                if owner is None:
                    continue  # vanished between our link and our read: try again
                if owner.get("job") == self.job:
                    if take_over_same_job and _gone_or_elsewhere(owner):
                        self._replace(owner, run=str(owner.get("run", "")))
                        logger.warning("rank 0 of job %s takes over the lock of %s from process %s on %s",
                                       self.job, self.output_dir, owner.get("pid"), owner.get("host"))
                    else:
                        self.record = owner  # a process of our own job holds it: share, never remove
                    return self
                self._refuse_unless_stale(owner)
                self._replace(owner, run=uuid.uuid4().hex)
                return self
        raise ConfigError(f"could not lock output_dir {self.output_dir}: another run keeps taking it")

    def _record(self, run: str) -> dict:
        return {"job": self.job, "run": run, "token": self.token, "pid": os.getpid(),
                "host": socket.gethostname(), "started": time.time()}

    def _write_temp(self, record: dict) -> str:
        tmp = f"{self.path}.tmp-{self.token}"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            _remove(tmp)
            raise _fail(self.output_dir, self.path, exc) from None
        return tmp

    def _create(self, run: str) -> bool:
        """Link a complete record into place; False when a lock exists."""
        record = self._record(run)
        tmp = self._write_temp(record)
        try:
            os.link(tmp, self.path)  # atomic, fails when the lock exists (also on NFS)
        except FileExistsError:
            return False
        except OSError as exc:
            raise _fail(self.output_dir, self.path, exc) from None
        finally:
            _remove(tmp)
        self.record, self.held = record, True
        return True

    def _replace(self, owner: dict, run: str) -> None:
        """Swap the lock ``owner`` holds for ours (under the guard; never leaves no lock in between)."""
        record = self._record(run)
        tmp = self._write_temp(record)
        try:
            if self._read() != owner:
                raise ConfigError(f"could not lock output_dir {self.output_dir}: another run took it just now")
            os.replace(tmp, self.path)
        except OSError as exc:
            raise _fail(self.output_dir, self.path, exc) from None
        finally:
            _remove(tmp)
        self.record, self.held = record, True

    def _read(self) -> Optional[dict]:
        """The lock's record; None when there is no lock."""
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read(65536)
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise ConfigError(f"{self.path} is a directory, not a lock file: remove it (rm -r {self.path}) "
                              "or choose another --output_dir") from None
        except OSError as exc:
            raise ConfigError(f"the lock {self.path} cannot be read ({exc.strerror}): "
                              "choose another --output_dir") from None
        try:
            owner = json.loads(text)
            int(owner["pid"]), str(owner["host"])
            return owner
        except (ValueError, KeyError, TypeError):
            return {"unreadable": True}

    def _refuse_unless_stale(self, owner: dict) -> None:
        if owner.get("unreadable"):
            try:
                age = time.time() - os.path.getmtime(self.path)
            except OSError:
                age = 0.0
            if age < UNREADABLE_GRACE_SECONDS:
                raise ConfigError(f"the lock {self.path} is unreadable: if no run uses {self.output_dir}, "
                                  "delete it and run again")
            logger.warning("taking over the unreadable lock of %s (%.0f s old)", self.output_dir, age)
            return
        pid, host = int(owner["pid"]), str(owner["host"])
        if host != socket.gethostname():
            raise ConfigError(f"output_dir {self.output_dir} is in use by process {pid} on host {host} "
                              f"(lock {self.path}): wait for that run, use another --output_dir, or delete the "
                              "lock file if that run is gone")
        if pid_alive(pid):
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(owner.get("started", 0))))
            raise ConfigError(f"output_dir {self.output_dir} is in use by live process {pid} on {host} since "
                              f"{started}: wait for it to finish or use another --output_dir")
        logger.warning("taking over the lock of %s left by process %s, which is gone", self.output_dir, pid)

    # ---- release --------------------------------------------------------------------
    def release(self) -> None:
        """Remove the lock if it is still ours (never one another run holds now)."""
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
                    log("the lock of %s is no longer ours (now process %s on %s): left in place",
                        self.output_dir, owner.get("pid"), owner.get("host"))
        except (OSError, ConfigError) as exc:
            logger.warning("could not release the lock %s: %s", self.path, exc)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """``flock`` on output_dir: racers on this host take turns (best effort where flock is unsupported)."""
        try:
            fd = os.open(self.output_dir, os.O_RDONLY)
        except OSError:
            yield
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                pass  # e.g. some network filesystems: the link-based creation is still atomic
            yield
        finally:
            os.close(fd)  # closing releases the flock


def _gone_or_elsewhere(owner: dict) -> bool:
    if owner.get("host") != socket.gethostname():
        return True
    try:
        return not pid_alive(int(owner.get("pid", -1)))
    except (TypeError, ValueError):
        return True


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError:
        pass


@contextlib.contextmanager
def hold_for_command(output_dir: str, job: str) -> Iterator[RunLock]:
    """Hold the lock of ``output_dir`` for ``job`` around a whole command.

    Exports ``PTRAIN_JOB_ID=job`` so that the processes this command starts (the
    launcher, its ranks, their restarts) share the lock instead of refusing
    themselves. Used by ``ptrain run``; the lock is removed at the end if ours.
    """
    lock = RunLock(output_dir, job=job).acquire()
    previous = os.environ.get(JOB_ENV)
    os.environ[JOB_ENV] = job
    try:
        yield lock
    finally:
        if previous is None:
            os.environ.pop(JOB_ENV, None)
        else:
            os.environ[JOB_ENV] = previous
        lock.release()
