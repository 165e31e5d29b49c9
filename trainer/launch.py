"""Launching: the one place that builds the ``paddle.distributed.launch`` command and decides whether to
start it again. ``ptrain run TASK`` and ``ptrain launch SCRIPT`` share the flags and the restart loop.

Paddle's launcher does the rendezvous and the process management; this module only chooses its flags,
relaunches it after a restartable failure (at most ``--max_restarts`` restarts in all on this node) and
tells the workers to resume: the workers of a relaunched job, and every worker of an etcd job (whose
launcher restarts workers with the environment of their first start), get ``PTRAIN_RESUME=auto``, which
``Trainer.fit`` reads (:func:`resume_after_restart`) as ``resume_from_checkpoint="auto"``: the newest
complete checkpoint in output_dir, or a fresh start when there is none.

With an etcd master (``--master etcd://HOST:PORT``) paddle's launcher runs through
:mod:`trainer.elastic_launch` at ``--elastic_level 0``: a node whose own worker fails ends its launcher
and is relaunched from here (its workers' exit code decides whether a restart can help); the other
nodes' launchers restart their workers themselves when the etcd heartbeat of a peer changes (a peer
failed, left, or joined). Those in-launcher restarts count against the same budget.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from typing import List, Optional

from .errors import ConfigError
from .supervise import run_launcher

LAUNCH_FLAGS = ("--nproc", "--gpus", "--ips", "--nnodes", "--master", "--rank", "--job_id", "--max_restarts",
                "--elastic_timeout", "--log_dir")
# exit codes that a relaunch cannot fix: bad configuration, bad data, training cannot go on (e.g. NaN guard,
# loss-spike retries exhausted), preempted (SIGINT, SIGTERM). Everything else (1 other error, 4 a callback
# failed, 124 stall watchdog, a worker killed by a signal, GAVE_UP) is restarted while restarts are left.
NO_RESTART = (0, 2, 3, 5, 130, 143)
GAVE_UP = 75  # trainer.elastic_launch: paddle's launcher stopped before the job completed (e.g. "peer not ready")
RESUME_ENV = "PTRAIN_RESUME"
ETCD = "etcd://"


def add_launch_flags(parser: argparse.ArgumentParser) -> None:
    """The launcher flags of ``ptrain run`` and ``ptrain launch`` (one group, one meaning)."""
    g = parser.add_argument_group("launcher", "multi-process and multi-node runs through paddle.distributed.launch")
    g.add_argument("--nproc", type=int, default=None, help="processes on this node (CPU: gloo; GPU: one per card)")
    g.add_argument("--gpus", default=None, help="GPU ids for paddle.distributed.launch, e.g. 0,1,2,3")
    g.add_argument("--ips", default=None, help="comma-separated node IPs for a multi-node run")
    g.add_argument("--nnodes", default=None, help="number of nodes N, or MIN:MAX for an elastic job (etcd master)")
    g.add_argument("--master", default=None,
                   help="IP:PORT of the master node, or etcd://HOST:PORT for a fault-tolerant, elastic job")
    g.add_argument("--rank", type=int, default=None, help="this node's rank (with --nnodes and an IP:PORT master)")
    g.add_argument("--job_id", default=None, help="the job's name, the same on every node (needed with etcd)")
    g.add_argument("--max_restarts", type=int, default=0,
                   help="restart after a runtime failure up to N times on this node, resuming from the newest "
                        "complete checkpoint")
    g.add_argument("--elastic_timeout", type=int, default=None,
                   help="etcd: seconds to wait for more nodes before starting with MIN (paddle's default 30)")
    g.add_argument("--log_dir", default=None,
                   help="the launcher's and workers' logs (ptrain run: OUTPUT_DIR/launch_logs; launch: ./log)")


def check_launch_flags(ns) -> None:
    """One clear ConfigError for a launcher flag that cannot work."""
    if ns.nproc is not None and ns.nproc < 1:
        raise ConfigError(f"--nproc={ns.nproc} is not allowed: give 1 or more processes")
    if ns.max_restarts < 0:
        raise ConfigError(f"--max_restarts={ns.max_restarts} is not allowed: give 0 or more restarts")
    if ns.nnodes is not None:
        parts = str(ns.nnodes).split(":")
        if len(parts) > 2 or not all(p.isdigit() and int(p) > 0 for p in parts) or int(parts[0]) > int(parts[-1]):
            raise ConfigError(f"--nnodes={ns.nnodes} is not allowed: give N or MIN:MAX nodes (1 <= MIN <= MAX)")
        if len(parts) == 2 and not is_etcd(ns):
            raise ConfigError(f"--nnodes={ns.nnodes}: MIN:MAX needs an etcd master (--master etcd://HOST:PORT)")
    if is_etcd(ns):
        host, _, port = ns.master[len(ETCD):].rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"--master={ns.master} is not allowed: give etcd://HOST:PORT")
        if not ns.job_id:
            raise ConfigError("--master etcd://... needs --job_id NAME: the same name on every node of the job")
    if ns.elastic_timeout is not None and ns.elastic_timeout < 6:
        # paddle's launcher re-registers a node's etcd heartbeat every 5 s: a shorter wait can start a node alone
        # while its peers are re-registering
        raise ConfigError(f"--elastic_timeout={ns.elastic_timeout} is not allowed: give 6 or more seconds (paddle's "
                          "heartbeat period is 5 s)")


def is_etcd(ns) -> bool:
    return bool(ns.master and ns.master.startswith(ETCD))


def wants_launch(ns) -> bool:
    if "PADDLE_TRAINER_ID" in os.environ:  # already inside a launched process
        return False
    return bool((ns.nproc and ns.nproc > 1) or ns.gpus or ns.ips or ns.nnodes or ns.master or ns.max_restarts)


def resume_after_restart(requested: Optional[str], output_dir: str) -> Optional[str]:
    """What ``Trainer.fit`` resumes from: ``requested`` (its argument or ``resume_from_checkpoint``), except in a
    restarted job (``PTRAIN_RESUME=auto``) whose output_dir holds checkpoints: then ``"auto"``, the newest complete
    one, so that a restart goes on from where the job was and never back to the checkpoint it started from."""
    if os.environ.get(RESUME_ENV) != "auto":
        return requested
    from .checkpoint_io import list_checkpoints

    return "auto" if list_checkpoints(output_dir) else requested


def _drop_flags(argv: List[str], names) -> List[str]:
    """``argv`` without the flags in ``names`` (``--flag value`` and ``--flag=value`` forms)."""
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
            continue
        if token.split("=", 1)[0] in names:
            skip = "=" not in token
            continue
        out.append(token)
    return out


def run_target(argv: List[str]) -> List[str]:
    """What the launcher runs for ``ptrain run ...``: this command again, without the launcher flags."""
    return [os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_entry.py")] + _drop_flags(argv, LAUNCH_FLAGS)


def launch_command(ns, target: List[str], log_dir: str, internal_restarts: int = 0) -> List[str]:
    """The launcher line that runs ``target`` (a script and its arguments) on every process of this node.

    ``internal_restarts``: how many times an etcd launcher may restart its workers itself.
    """
    if is_etcd(ns):  # paddle's launcher in a process that can import the etcd client (see elastic_launch)
        cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_launch.py"),
               "--elastic_level", "0",
               "--max_restart", str(internal_restarts - 1)]  # paddle runs max_restart + 1 restarts
    else:
        cmd = [sys.executable, "-m", "paddle.distributed.launch"]
    cmd += ["--log_dir", log_dir]
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
