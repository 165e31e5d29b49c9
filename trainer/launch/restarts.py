"""Launching: the one place that builds the ``paddle.distributed.launch`` command and decides whether to
start it again. ``ptrain run TASK`` and ``ptrain launch SCRIPT`` share the flags and the restart loop.

Paddle's launcher does the rendezvous and the process management; this module only chooses its flags,
relaunches it after a restartable failure (at most ``--max_restarts`` restarts in all on this node) and
tells the workers to resume: the workers of a relaunched job, and every worker of an etcd job (whose
launcher restarts workers with the environment of their first start), get ``PTRAIN_RESUME=auto``, which
``Trainer.fit`` reads (``trainer.checkpoint.resume.resume_after_restart``) as ``resume_from_checkpoint="auto"``: the newest
complete checkpoint in output_dir, or a fresh start when there is none.

With an etcd master (``--master etcd://HOST:PORT``) paddle's launcher runs through
:mod:`trainer.launch.elastic` at ``--elastic_level 0``: a node whose own worker fails ends its launcher
and is relaunched from here (its workers' exit code decides whether a restart can help); the other
nodes' launchers restart their workers themselves when the etcd heartbeat of a peer changes (a peer
failed, left, or joined). Those in-launcher restarts count against the same budget.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from typing import List, Optional

from ..checkpoint import RESUME_ENV
from ..errors import ConfigError
from .flags import ETCD, is_etcd
from .supervise import run_launcher

# exit codes that a relaunch cannot fix: bad configuration, bad data, training cannot go on (e.g. NaN guard,
# loss-spike retries exhausted), preempted (SIGINT, SIGTERM). Everything else (1 other error, 4 a callback
# failed, 124 stall watchdog, a worker killed by a signal, GAVE_UP) is restarted while restarts are left.
NO_RESTART = (0, 2, 3, 5, 130, 143)
GAVE_UP = 75  # trainer.launch.elastic: paddle's launcher stopped before the job completed (e.g. "peer not ready")


def launch_command(ns, target: List[str], log_dir: str, internal_restarts: int = 0) -> List[str]:
    """The launcher line that runs ``target`` (a script and its arguments) on every process of this node.

    ``internal_restarts``: how many times an etcd launcher may restart its workers itself.
    """
    if is_etcd(ns):  # paddle's launcher in a process that can import the etcd client (see elastic_launch)
        cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic.py"),
               "--elastic_level", "0",
               "--max_restart", str(internal_restarts - 1)]  # paddle runs max_restart + 1 restarts
    else:
        cmd = [sys.executable, "-m", "paddle.distributed.launch"]
    cmd += ["--log_dir", log_dir]
    if not getattr(ns, "verbose", False) and "PADDLE_LOG_LEVEL" not in os.environ:
        # no configuration dump; a flag, not PADDLE_LOG_LEVEL, which the launcher echoes as "LAUNCH WARNING args
        # log_level will be overridden by env" on every start
        cmd += ["--log_level", "WARNING"]
    for flag, value in (("--nproc_per_node", ns.nproc), ("--devices", ns.gpus), ("--ips", ns.ips),
                        ("--nnodes", ns.nnodes), ("--master", ns.master), ("--rank", ns.rank),
                        ("--job_id", ns.job_id), ("--elastic_timeout", ns.elastic_timeout)):
        if value is not None and value != "":
            cmd += [flag, str(value)]
    return cmd + list(target)


def launch_with_restarts(ns, target: List[str], log_dir: str) -> int:
    """Run the launcher; after a restartable failure start it again, at most ``--max_restarts`` restarts in all.

    Each restart is logged with its cause. With an etcd master, the launcher's own restarts of its workers
    (a peer failed, left or joined) count too, and a launcher that gave up ("peer not ready") is started again.
    """
    env = dict(os.environ)
    if is_etcd(ns):
        # an etcd launcher restarts its workers with the environment of their first start: set it from the start
        env[RESUME_ENV] = "auto"
    used = 0
    while True:
        status_file = None
        if is_etcd(ns):
            wait_for_etcd(ns)
            fd, status_file = tempfile.mkstemp(prefix="ptrain-launch-", suffix=".json")
            os.close(fd)
            env["PTRAIN_LAUNCH_STATUS"] = status_file
        cmd = launch_command(ns, target, log_dir, internal_restarts=ns.max_restarts - used)
        print("ptrain: launching: " + " ".join(cmd), file=sys.stderr, flush=True)
        code = run_launcher(cmd, env)
        outcome = _read_status(status_file)
        used += outcome.get("restarts", 0)
        if code == 0:
            return 0
        cause = outcome.get("cause") or f"the launcher exited with code {code}"
        if code in NO_RESTART or code < 0 or used >= ns.max_restarts:
            why = ("no restart can fix it" if code in NO_RESTART or code < 0 else
                   f"all {ns.max_restarts} restarts are used" if ns.max_restarts else "restarts are off (--max_restarts)")
            if code not in (130, 143):
                print(f"ptrain: the run failed with exit code {code} ({cause}; {why}); the workers' logs are in "
                      f"{log_dir}", file=sys.stderr, flush=True)
            return code
        used += 1
        env[RESUME_ENV] = "auto"
        print(f"ptrain: restart {used} of {ns.max_restarts} from the latest checkpoint ({time.strftime('%H:%M:%S')}): "
              f"{cause}", file=sys.stderr, flush=True)


def _read_status(path: Optional[str]) -> dict:
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        return json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def wait_for_etcd(ns, timeout: Optional[float] = None) -> None:
    """Return once the etcd master accepts connections; one clear error after ``--elastic_timeout`` (default 30) s."""
    host, _, port = ns.master[len(ETCD):].rpartition(":")
    timeout = timeout if timeout is not None else (ns.elastic_timeout or 30)
    deadline = time.time() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2):
                return
        except OSError as exc:
            if time.time() >= deadline:
                raise ConfigError(f"the etcd master {host}:{port} is unreachable ({exc}): start etcd, then run the "
                                  "same command again (the job resumes from its newest checkpoint)") from None
            time.sleep(0.5)
