"""RunLock: one live run per output_dir.

``output_dir/.ptrain.lock`` holds the owner's pid, host and start time and is
created atomically (``O_CREAT | O_EXCL``). A second run while the owner lives
fails at once naming it; a lock left by a dead process on this host is taken
over with a warning. Creating it is also the early check that output_dir can
be written at all.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time

from .errors import ConfigError

logger = logging.getLogger("trainer.lock")
LOCK_NAME = ".ptrain.lock"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    def __init__(self, output_dir: str):
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, LOCK_NAME)
        self.held = False

    def acquire(self) -> None:
        try:
            os.makedirs(self.output_dir, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"output_dir {self.output_dir} cannot be created ({exc.strerror}): "
                              "choose a writable --output_dir") from None
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            except OSError as exc:
                raise ConfigError(f"output_dir {self.output_dir} cannot be written ({exc.strerror}): "
                                  "choose a writable --output_dir") from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return
        raise ConfigError(f"could not lock output_dir {self.output_dir}: another run keeps taking it")

    def _take_over_if_stale(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                owner = json.load(f)
            pid, host = int(owner["pid"]), str(owner["host"])
        except (OSError, ValueError, KeyError, TypeError):
            owner, pid, host = {}, -1, socket.gethostname()  # unreadable: written by a process that died mid-write
        if host != socket.gethostname():
            raise ConfigError(f"output_dir {self.output_dir} is in use by process {pid} on host {host} "
                              f"(lock {self.path}): wait for that run, use another --output_dir, or delete the "
                              "lock file if that run is gone")
        if pid > 0 and pid != os.getpid() and pid_alive(pid):
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.get("started", 0)))
            raise ConfigError(f"output_dir {self.output_dir} is in use by live process {pid} on {host} since "
                              f"{started}: wait for it to finish or use another --output_dir")
        logger.warning("taking over the lock of %s left by process %s, which is gone", self.output_dir, pid)
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass

    def release(self) -> None:
        if self.held:
            self.held = False
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
