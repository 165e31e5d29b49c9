"""``ptrain``: the command line's entry point and its commands (the usage is in ``trainer.cli.parser``)."""

from __future__ import annotations

import json
import os
import sys
from typing import List, Optional

from ..errors import ConfigError, DataError, TrainerError, cli_terms
from ..launch.flags import check_launch_flags, check_log_dir, wants_launch
from ..launch.restarts import launch_with_restarts
from ..launch.slurm import requeue_if_preempted
from ..process import guard_console, install_startup_handlers, record_failure
from .parser import build_parser
from .run import resolve_run, run_here, run_target
from .tasks import available_tasks, get_task, missing_extra


def main(argv: Optional[List[str]] = None) -> int:
    guard_console()  # `ptrain ... | tee log` whose tee is gone: writes go nowhere instead of raising
    install_startup_handlers()  # SIGTERM/SIGINT before training: exit 143/130 at once
    argv = list(sys.argv[1:] if argv is None else argv)
    wants_help = "-h" in argv or "--help" in argv
    run_task = argv[1] if wants_help and argv[:1] == ["run"] and len(argv) > 1 and not argv[1].startswith("-") else None
    parser = build_parser(predict_help=argv[:1] == ["predict"] and wants_help, run_task=run_task)
    ns, extra = parser.parse_known_args(argv)
    from .console import configure  # before paddle loads: the quiet console (--verbose: everything)

    configure(verbose=getattr(ns, "verbose", False), main_process=os.environ.get("PADDLE_TRAINER_ID", "0") == "0")
    debug = getattr(ns, "debug", False)
    try:
        with cli_terms():  # errors advise flags, not Python keywords
            code = _dispatch(ns, extra, argv)
        if ns.command in ("run", "launch"):
            requeue_if_preempted(code)  # 138 inside a Slurm job: scontrol requeue it (trainer.launch.slurm)
        return code
    except TrainerError as exc:
        if debug:
            raise
        print(f"ptrain: error: {exc}", file=sys.stderr)
        if "PADDLE_TRAINER_ID" in os.environ:  # a rank of ptrain's launcher: ptrain names it on its console
            record_failure(int(os.environ.get("PADDLE_TRAINER_ID") or 0), exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("ptrain: interrupted", file=sys.stderr)
        return 130


def _dispatch(ns, extra: List[str], argv: List[str]) -> int:
    if ns.command == "list":
        return _cmd_list()
    if ns.command == "visualdl":
        from .visualdl_serve import main as visualdl_main

        return visualdl_main(extra)
    if ns.command == "inspect":
        return _cmd_inspect(ns.checkpoint)
    if ns.command == "verify-resume":
        from .verify_resume import main as verify_resume_main

        if ns.steps < 1:
            raise ConfigError(f"--steps={ns.steps} is not allowed: give 1 or more steps")
        return verify_resume_main(ns.task, ns.recipe, extra, ns.steps, ns.workdir)
    if ns.command == "launch":
        if extra:
            raise ConfigError(f"unexpected arguments {extra}: ptrain launch [launcher flags] SCRIPT [ARGS...]")
        return _cmd_launch(ns)
    if ns.command == "serve":
        if extra:
            raise ConfigError(f"unexpected arguments {extra}: ptrain serve MODEL_DIR [--port N ...]")
        from .serve import cmd_serve

        return cmd_serve(ns)
    if ns.command == "predict":
        if extra:
            raise ConfigError(f"unexpected arguments {extra}: ptrain predict TASK --model DIR INPUT...")
        return _cmd_predict(ns.task, ns.model, ns.inputs)
    return _cmd_run(ns, extra, argv)


def _cmd_list() -> int:
    names_of: dict = {}  # one line per task: the names that load the same object are aliases
    for name, ep in sorted(available_tasks().items()):
        names_of.setdefault(ep.value, []).append(name)
    for names in sorted(names_of.values(), key=lambda n: min(n, key=len)):
        name = min(names, key=len)
        task = get_task(name, usable=False)
        aliases = [n for n in sorted(names) if n != name]
        print(f"{name:<12} {task.description}" + (f" (also: {', '.join(aliases)})" if aliases else ""))
        print(f"{'':<12} recipes: {', '.join(task.recipes())} (default {task.default_recipe})")
        missing = missing_extra(available_tasks()[name])
        if missing:  # a PaddleFormers environment lists ernie, and says why it cannot run here
            print(f"{'':<12} {missing}")
    return 0


def _cmd_predict(task_name: str, model_dir: str, inputs: List[str]) -> int:
    task = get_task(task_name)
    if task.predict is None:
        raise ConfigError(f"task {task_name} has no predict: it cannot classify raw inputs")
    if not os.path.isdir(model_dir):
        raise ConfigError(f"--model {model_dir} does not exist: give the inference directory of a finished run")
    for row in task.predict(model_dir, inputs):
        print(json.dumps(row, ensure_ascii=False, sort_keys=True))
    return 0


def _cmd_inspect(path: str) -> int:
    from ..checkpoint.manifest import checkpoints_dir, verify
    from ..checkpoint.store import list_checkpoints
    from .describe import auto_choice, describe, resolve_pointer

    if not os.path.exists(path):
        raise ConfigError(f"{path} does not exist: give a checkpoint directory or a run's output_dir")
    print(describe(path))
    if os.path.isdir(checkpoints_dir(path)):  # a run: 3 when it holds checkpoints and none can be resumed
        if list_checkpoints(path) and auto_choice(path) is None:
            print(f"ptrain: no checkpoint in {path} verifies: resume 'auto' would start fresh", file=sys.stderr)
            return DataError.exit_code
        return 0
    try:
        verify(resolve_pointer(path))
    except DataError:
        return DataError.exit_code  # the report above says which file is wrong
    return 0


def _cmd_run(ns, extra: List[str], argv: List[str]) -> int:
    task, options, args = resolve_run(ns.task, ns.recipe, ns.config, extra)  # validate before any heavy work
    check_launch_flags(ns)
    log_dir = ns.log_dir or os.path.join(args.output_dir, "launch_logs")
    if wants_launch(ns):  # what this build cannot run on the processes about to start: one line, nothing launched
        from ..capabilities import check_launch

        check_launch(args, _launch_world_size(ns), ns.gpus)
        check_log_dir(log_dir)
    if ns.dry_run:
        return run_here(task, options, args, dry_run=True)
    from ..checkpoint.output_dir import claim_for_command

    with claim_for_command(args, ns):  # one job owns output_dir until this command's last line
        if wants_launch(ns):
            return launch_with_restarts(ns, run_target(argv), log_dir)
        return run_here(task, options, args, dry_run=False)


def _launch_world_size(ns) -> int:
    """The processes ``ptrain run``'s launcher flags start: per node (``--nproc``, else one per ``--gpus`` card)
    times the nodes (``--nnodes``, its MIN for an elastic job, else one per ``--ips`` address)."""
    per_node = ns.nproc or (len(str(ns.gpus).split(",")) if ns.gpus else 1)
    nodes = int(str(ns.nnodes).split(":")[0]) if ns.nnodes else (len(str(ns.ips).split(",")) if ns.ips else 1)
    return per_node * nodes


def _cmd_launch(ns) -> int:
    check_launch_flags(ns)
    if not os.path.isfile(ns.script):
        raise ConfigError(f"{ns.script} does not exist: ptrain launch [launcher flags] SCRIPT [ARGS...]")
    from ..capabilities import check_gpus

    log_dir = ns.log_dir or "log"
    check_gpus(ns.gpus)  # as ptrain run does: one line, nothing launched
    check_log_dir(log_dir)
    from ..checkpoint.lock import JOB_ENV, job_key

    # the job's identity for its ranks and restarts: the new rank 0 of an elastic restart, on another node or
    # in another container, takes its own job's lock over at once instead of waiting for the lease
    os.environ.setdefault(JOB_ENV, job_key(ns.job_id, ns.master, ns.ips))
    return launch_with_restarts(ns, [ns.script, *ns.script_args], log_dir)
