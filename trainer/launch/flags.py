"""The launcher flags of ``ptrain run`` and ``ptrain launch``: one group, one meaning, one check."""

from __future__ import annotations

import argparse
import os
from typing import List

from ..errors import ConfigError

LAUNCH_FLAGS = ("--nproc", "--gpus", "--ips", "--nnodes", "--master", "--rank", "--job_id", "--max_restarts",
                "--elastic_timeout", "--log_dir")
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
                   help="the workers' logs (workerlog.N) and the job's console (console.log); default "
                        "OUTPUT_DIR/launch_logs for ptrain run, ./log for ptrain launch")


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


def check_log_dir(log_dir: str) -> None:
    """The workers' log folder: a file of that name (``... | tee log`` makes ``./log``, paddle's launcher's and
    ``ptrain launch``'s default folder) is one ConfigError line before anything is launched."""
    if os.path.exists(log_dir) and not os.path.isdir(log_dir):
        raise ConfigError(f"the workers' log folder {log_dir} is a file: give --log_dir DIR (a pipe such as "
                          f"`| tee {log_dir}` makes that file: tee into another name)")


def is_etcd(ns) -> bool:
    return bool(ns.master and ns.master.startswith(ETCD))


def wants_launch(ns) -> bool:
    if "PADDLE_TRAINER_ID" in os.environ:  # already inside a launched process
        return False
    return bool((ns.nproc and ns.nproc > 1) or ns.gpus or ns.ips or ns.nnodes or ns.master or ns.max_restarts)



def drop_flags(argv: List[str], names) -> List[str]:
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
