"""Launching: the one place that builds the ``paddle.distributed.launch`` command and decides whether to
start it again (``ptrain run TASK`` with launcher flags)."""

from __future__ import annotations

import os
import sys
from typing import List

from .supervise import run_launcher

LAUNCH_FLAGS = ("--nproc", "--gpus", "--ips", "--nnodes", "--master", "--rank", "--max_restarts")
# exit codes that a relaunch cannot fix: bad configuration, bad data, training cannot go on (e.g. NaN guard,
# loss-spike retries exhausted), preempted (SIGINT, SIGTERM)
NO_RESTART = (0, 2, 3, 5, 130, 143)


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


def launch_command(ns, argv: List[str], output_dir: str) -> List[str]:
    """The ``python -m paddle.distributed.launch`` line that reruns this command on every process."""
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--log_dir", os.path.join(output_dir, "launch_logs")]
    if ns.nproc:
        cmd += ["--nproc_per_node", str(ns.nproc)]
    if ns.gpus:
        cmd += ["--devices", ns.gpus]
    if ns.ips:
        cmd += ["--ips", ns.ips]
    if ns.nnodes:
        cmd += ["--nnodes", str(ns.nnodes)]
    if ns.master:
        cmd += ["--master", ns.master]
    if ns.rank is not None:
        cmd += ["--rank", str(ns.rank)]
    return cmd + [os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_entry.py")] + _drop_flags(argv, LAUNCH_FLAGS)


def wants_launch(ns) -> bool:
    if "PADDLE_TRAINER_ID" in os.environ:  # already inside a launched process
        return False
    return bool((ns.nproc and ns.nproc > 1) or ns.gpus or ns.ips or ns.nnodes or ns.max_restarts)


def _with_auto_resume(argv: List[str]) -> List[str]:
    return _drop_flags(argv, ("--resume_from_checkpoint",)) + ["--resume_from_checkpoint", "auto"]


def launch_with_restarts(ns, argv: List[str], output_dir: str) -> int:
    """Run the launcher; after a runtime failure relaunch from the latest checkpoint, at most --max_restarts times."""
    attempt = 0
    while True:
        cmd = launch_command(ns, argv, output_dir)
        print("ptrain: launching: " + " ".join(cmd), file=sys.stderr)
        code = run_launcher(cmd)
        if code in NO_RESTART or attempt >= ns.max_restarts:
            if code not in (0, 130, 143):
                print(f"ptrain: the run failed with exit code {code}; the failing rank's log is in "
                      f"{os.path.join(output_dir, 'launch_logs')}", file=sys.stderr)
            return code
        attempt += 1
        print(f"ptrain: the run failed with exit code {code}; restart {attempt} of {ns.max_restarts} from the latest "
              "checkpoint", file=sys.stderr)
        argv = _with_auto_resume(argv)
