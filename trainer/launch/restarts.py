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

import contextlib
import json
import os
import shlex
import shutil
import socket
import sys
import tempfile
import time
from typing import List, Optional

from ..checkpoint import RESUME_ENV
from ..errors import ConfigError
from ..process import FAILURE_DIR_ENV, PREEMPTED_CODES, REQUEUE_EXIT, read_failures
from .flags import ETCD, is_etcd
from .relay import ConsoleLog
from .supervise import STOPPED_AFTER_FAILURE, run_launcher

# exit codes that a relaunch cannot fix: bad configuration, bad data, training cannot go on (e.g. NaN guard,
# loss-spike retries exhausted), the output_dir's lease lost to another run (7), out of memory at a micro-batch of 1 (8), preempted (SIGINT, SIGTERM or SIGHUP; SIGUSR1's 138: saved, requeue the job; a
# restart inside the allocation that is about to end would be killed with it). Everything else (1 other error, 4 a callback
# failed, 124 stall watchdog, a worker killed by a signal, GAVE_UP) is restarted while restarts are left.
NO_RESTART = (0, 2, 3, 5, 7, 8, 130, REQUEUE_EXIT, 143)
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
    log_dir = os.path.abspath(log_dir)  # named in every closing line: a path that works from anywhere
    log = ConsoleLog(log_dir)  # the job's console, also in LOG_DIR/console.log
    try:
        return _launch_until_done(ns, target, log_dir, log)
    finally:
        log.close()


def _launch_until_done(ns, target: List[str], log_dir: str, log: ConsoleLog) -> int:
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
        log.say("ptrain: launching: " + " ".join(cmd))
        failures = tempfile.mkdtemp(prefix="ptrain-failures-")
        env[FAILURE_DIR_ENV] = failures
        try:
            code, first_failed = run_launcher(cmd, env, log, quiet=not getattr(ns, "verbose", False))
            records = read_failures(failures)
            _keep_tracebacks(failures, log_dir)
            outcome = _read_status(status_file)
        finally:  # a Ctrl-C or SIGTERM through the launcher leaves neither behind in the temporary folder
            shutil.rmtree(failures, ignore_errors=True)
            if status_file:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(status_file)
        used += outcome.get("restarts", 0)
        if code == 0:
            log.say(f"ptrain: the job completed; the workers' logs and this console are in {log_dir}")
            return 0
        code, named = _failure_of(code, records, log_dir, log)
        said = named is not None  # each rank's recorded error is on the console already
        if not named and first_failed and first_failed[1] and first_failed[1] in NO_RESTART and first_failed[1] != code:
            # paddle's launcher exits with the code of the first rank in rank order (rank 0, stopped by the launcher
            # itself after rank 1 failed); the rank it saw failing first ended with a code no restart can fix
            code, named = first_failed[1], f"rank {first_failed[0]} exited with code {first_failed[1]}"
        cause = named or outcome.get("cause") or f"the launcher exited with code {code}"
        if code in NO_RESTART or code < 0 or used >= ns.max_restarts:
            why = ("no restart can fix it" if code in NO_RESTART or code < 0 else
                   f"all {ns.max_restarts} restarts are used" if ns.max_restarts else "restarts are off (--max_restarts)")
            if code not in PREEMPTED_CODES and not said:
                log.say(f"ptrain: the run failed with exit code {code} ({cause}; {why}); the workers' logs are in "
                        f"{log_dir}")
            elif code in PREEMPTED_CODES:
                log.say(f"ptrain: the job stopped with exit code {code} (preempted: each rank saved and exited); "
                        f"the workers' logs and this console are in {log_dir}")
            return code
        used += 1
        env[RESUME_ENV] = "auto"
        log.say(f"ptrain: restart {used} of {ns.max_restarts} from the latest checkpoint ({time.strftime('%H:%M:%S')}): "
                f"{cause}")


def _failure_of(code: int, records: list, log_dir: str = "log", log: Optional[ConsoleLog] = None):
    """The job's exit code and cause from what the ranks recorded (``trainer.process.record_failure``): a rank's
    error that no restart can fix (a DataError on rank 1 while rank 0 was stopped by the launcher) wins over the
    launcher's code; each recorded error is printed on ptrain's console."""
    final = [r for r in records if r.get("code") in NO_RESTART and r.get("code")]
    for (error, rcode), ranks in _same_errors(records).items():  # ranks that failed alike: one line
        what = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        then = "no restart can fix it" if rcode in NO_RESTART else "a restart may help"
        (log or ConsoleLog(None)).say(f"ptrain: {what} failed (exit {rcode}): {error} ({then}; the workers' logs "
                                      f"are in {log_dir})")
    chosen = final[0] if final else (records[0] if records else None)
    if chosen is None:
        return code, None
    cause = f"rank {chosen.get('rank')}: {chosen.get('error')}"
    if not final and code == STOPPED_AFTER_FAILURE:  # the launcher stopped the others: the failed rank's code
        return int(chosen["code"]), cause
    return (int(chosen["code"]) if final else code), cause


def _same_errors(records: list) -> dict:
    out: dict = {}
    for record in records:
        out.setdefault((record.get("error"), record.get("code")), []).append(record.get("rank"))
    return out


def _keep_tracebacks(failures: str, log_dir: str) -> None:
    """The ranks' tracebacks of errors they recorded (``trainer.process.record_failure``) into ``log_dir``."""
    try:
        names = [n for n in os.listdir(failures) if n.endswith(".traceback")]
        if names:
            os.makedirs(log_dir, exist_ok=True)
        for name in names:
            shutil.copyfile(os.path.join(failures, name), os.path.join(log_dir, name))
    except OSError:
        pass


def _read_status(path: Optional[str]) -> dict:
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        return json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}


def rerun_command(argv: Optional[List[str]] = None) -> str:
    """This ``ptrain`` command line, resuming: what to run after a failure that a new command can get past. A new
    ``ptrain run`` is a new run, refused in an output_dir that holds this job's checkpoints without
    ``--resume_from_checkpoint auto``, which is added; ``ptrain launch SCRIPT`` runs as it was (its workers
    resume through ``PTRAIN_RESUME``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), "")
    if command == "run" and not any(a == "--resume_from_checkpoint" or a.startswith("--resume_from_checkpoint=") for a in argv):
        argv += ["--resume_from_checkpoint", "auto"]
    return "ptrain " + " ".join(shlex.quote(a) for a in argv)


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
                raise ConfigError(f"the etcd master {host}:{port} is unreachable ({exc}): start etcd, then run "
                                  f"{rerun_command()} (it resumes from the newest checkpoint)") from None
            time.sleep(0.5)
