"""``ptrain``: run, launch, list and inspect training tasks.

    ptrain list
    ptrain run digits                                  # the task's demo recipe
    ptrain run digits --recipe demo --learning_rate 0.01 --max_steps 200
    ptrain run digits --nproc 2                        # 2 processes via paddle.distributed.launch
    ptrain run TASK --gpus 0,1,2,3                     # 4 GPUs on this node
    ptrain run TASK --gpus 0,1,2,3 --ips 10.0.0.1,10.0.0.2   # 2 nodes (run the same line on each)
    ptrain run TASK --nproc 2 --master etcd://10.0.0.1:2379 --job_id j1 --nnodes 1:2 --max_restarts 5
                                                       # elastic: on each node; dead workers/nodes restart the job
    ptrain launch --nproc 2 --max_restarts 3 train.py --lr 0.1   # your own script on the launcher, same flags
    ptrain run digits --dry_run                        # resolved arguments and callbacks, no training
    ptrain inspect runs/digits-demo/checkpoints/latest # what a checkpoint holds, every file verified
    ptrain inspect runs/digits-demo                    # a run's checkpoints, newest first
    ptrain verify-resume digits --steps 20             # self-test: resume vs uninterrupted, bit for bit
    ptrain predict TASK --model RUN/inference INPUT... # classify inputs with an exported model
    ptrain visualdl --logdir runs/digits-demo          # the curves in VisualDL (any visualdl option)

Launcher flags (run and launch): --nproc, --gpus, --ips, --nnodes N|MIN:MAX,
--master IP:PORT|etcd://HOST:PORT, --rank, --job_id, --max_restarts,
--elastic_timeout, --log_dir (see trainer/launch.py and docs/how-to/elastic.md).
A Trainer started with restarts resumes from the newest complete checkpoint
of its output_dir by itself after a restart.

Any ``--field value`` after the task name overrides a TrainingArguments field
or a task option; recipes are YAML (see trainer/task.py). Errors print one
line and exit non-zero (2 config, 3 data, 4 callback, 5 training, 1 other);
``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
from typing import List, Optional

from .errors import ConfigError, TrainerError
from .launch import add_launch_flags, check_launch_flags, launch_with_restarts, run_target, wants_launch


def _predict_inputs_help() -> str:
    """What each installed task's predict takes (its docstring), for ``ptrain predict --help``."""
    from .task import available_tasks, get_task

    lines = ["What each task expects (its preprocessing):"]
    for name in sorted(available_tasks()):
        try:
            task = get_task(name)
        except Exception as exc:  # noqa: BLE001 - help must print even if a task fails to load
            lines.append(f"  {name}: cannot be loaded ({type(exc).__name__}: {exc})")
            continue
        doc = " ".join((task.predict.__doc__ or "").replace("``", "").split()) if task.predict else "no predict"
        lines += textwrap.wrap(f"{name}: {doc}", width=100, initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)


def _parser(predict_help: bool = False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ptrain", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Exit codes: 0 ok, 1 other error, 2 bad configuration, 3 bad data, "
                                       "4 a callback failed, 5 training failed, 6 verify-resume found a divergence, "
                                       "124 stall watchdog stopped the run, 130/143 preempted by SIGINT/SIGTERM after "
                                       "saving a checkpoint.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list tasks and their recipes")
    run = sub.add_parser("run", help="train a task; extra --field value pairs override the recipe",
                         description="Train TASK with a recipe. Any further --field value pair overrides a "
                                     "TrainingArguments field or a task option (see --dry_run for all of them).")
    run.add_argument("task", help="task name (see ptrain list), or a recipe file whose top-level 'task:' names it")
    run.add_argument("--recipe", "--preset", dest="recipe", default=None,
                     help="recipe name or YAML path (default: the task's demo)")
    run.add_argument("--config", default=None, help="a YAML of TrainingArguments applied over the recipe")
    add_launch_flags(run)
    run.add_argument("--dry_run", action="store_true", help="print the resolved arguments and callbacks, then exit")
    run.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")
    run.add_argument("--verbose", action="store_true", help="show everything the quiet console hides: INFO of "
                     "libraries, DEBUG lines, every warning, paddle's C++ log lines (see trainer/console.py)")
    lch = sub.add_parser("launch", help="run your own training script on paddle.distributed.launch, with restarts",
                         description="Run SCRIPT with ARGS on every process through paddle.distributed.launch, with "
                                     "the launcher flags of ptrain run. With --max_restarts N a failed run is started "
                                     "again and a Trainer in SCRIPT resumes from the newest complete checkpoint of its "
                                     "output_dir by itself. With --master etcd://HOST:PORT (and --job_id, --nnodes "
                                     "MIN:MAX) the job is elastic: a dead worker or node restarts every surviving node, "
                                     "a node started later joins at the next restart. Launcher flags go before SCRIPT.")
    add_launch_flags(lch)
    lch.add_argument("script", help="the training script (a .py file)")
    lch.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    pred = sub.add_parser("predict", help="run an exported inference model of TASK on inputs",
                          description="Classify INPUTs (texts or file paths, as the task takes) with an exported "
                                      "inference model (OUTPUT_DIR/inference of a finished run). Inputs must look "
                                      "like the training data: see below.",
                          epilog=_predict_inputs_help() if predict_help else None,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    pred.add_argument("task", help="task name (see ptrain list)")
    pred.add_argument("inputs", nargs="+", help="inputs: texts or file paths, as the task takes")
    pred.add_argument("--model", required=True, help="directory of the exported inference model")
    pred.add_argument("--debug", action="store_true")
    sub.add_parser("visualdl", add_help=False, help="serve a run's curves: visualdl --logdir OUTPUT_DIR [its options], "
                   "answering requests without Accept-Language too (see trainer/visualdl_serve.py)")
    ins = sub.add_parser("inspect", help="what a checkpoint holds, or the checkpoints of a run directory",
                         description="PATH a checkpoint directory (or checkpoints/latest): step, epoch, metrics, "
                                     "world size, sizes, and whether every file matches the manifest. PATH a run's "
                                     "output_dir: its checkpoints, newest first, which are valid, which latest names.")
    ins.add_argument("checkpoint", metavar="PATH", help="a checkpoint directory, checkpoints/latest, or an output_dir")
    ins.add_argument("--debug", action="store_true")
    ver = sub.add_parser("verify-resume", help="self-test: is resuming exact on this setup?",
                         description="Train TASK 2N steps uninterrupted; train it again, preempted at step N, and "
                                     "resume in a fresh process; compare loss by loss and tensor by tensor. Prints "
                                     "the first divergence or that the runs are identical. Extra --field value pairs "
                                     "override the recipe as in ptrain run.")
    ver.add_argument("task", help="task name (see ptrain list)")
    ver.add_argument("--recipe", default=None, help="recipe name or YAML path (default: the task's demo)")
    ver.add_argument("--steps", type=int, default=20, help="N: checkpoint at N, compare at 2N (default 20)")
    ver.add_argument("--workdir", default=None, help="keep the three runs here (default: a temporary directory)")
    ver.add_argument("--debug", action="store_true")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    from .process import install_startup_handlers

    install_startup_handlers()  # SIGTERM/SIGINT before training: exit 143/130 at once
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser(predict_help=argv[:1] == ["predict"] and ("-h" in argv or "--help" in argv))
    ns, extra = parser.parse_known_args(argv)
    from .console import configure  # before paddle loads: the quiet console (--verbose: everything)

    configure(verbose=getattr(ns, "verbose", False), main_process=os.environ.get("PADDLE_TRAINER_ID", "0") == "0")
    debug = getattr(ns, "debug", False)
    try:
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
        if ns.command == "predict":
            if extra:
                raise ConfigError(f"unexpected arguments {extra}: ptrain predict TASK --model DIR INPUT...")
            return _cmd_predict(ns.task, ns.model, ns.inputs)
        return _cmd_run(ns, extra, argv)
    except TrainerError as exc:
        if debug:
            raise
        print(f"ptrain: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("ptrain: interrupted", file=sys.stderr)
        return 130


def _cmd_list() -> int:
    from .task import available_tasks, get_task

    for name in sorted(available_tasks()):
        task = get_task(name)
        print(f"{name:<12} {task.description}")
        print(f"{'':<12} recipes: {', '.join(task.recipes())} (default {task.default_recipe})")
    return 0


def _cmd_predict(task_name: str, model_dir: str, inputs: List[str]) -> int:
    from .task import get_task

    task = get_task(task_name)
    if task.predict is None:
        raise ConfigError(f"task {task_name} has no predict: it cannot classify raw inputs")
    if not os.path.isdir(model_dir):
        raise ConfigError(f"--model {model_dir} does not exist: give the inference directory of a finished run")
    for row in task.predict(model_dir, inputs):
        print(json.dumps(row, ensure_ascii=False, sort_keys=True))
    return 0


def _cmd_inspect(path: str) -> int:
    from .checkpoint_io import verify
    from .errors import DataError
    from .inspect import _resolve_pointer, describe

    if not os.path.exists(path):
        raise ConfigError(f"{path} does not exist: give a checkpoint directory or a run's output_dir")
    print(describe(path))
    target = _resolve_pointer(path)
    if os.path.isfile(os.path.join(target, "manifest.json")) or not os.path.isdir(os.path.join(path, "checkpoints")):
        try:
            verify(target)
        except DataError:
            return DataError.exit_code  # the report above says which file is wrong
    return 0


def resolve_run(task_name: str, recipe: Optional[str], config: Optional[str], overrides: List[str]):
    """Task, options and TrainingArguments for a run: recipe < --config < --field overrides."""
    from .args import TrainingArguments, coerce_fields, load_yaml_mapping, parse_overrides
    from .task import get_task

    user_values, user_file = {}, None
    if task_name.endswith((".yaml", ".yml")) and os.path.isfile(task_name):
        user_file, user_values = task_name, dict(load_yaml_mapping(task_name))
        task_name = user_values.pop("task", None)
        if not isinstance(task_name, str):
            raise ConfigError(f"{user_file}: a recipe file given as `ptrain run FILE` names its task at the top "
                              "(task: ernie), then any TrainingArguments fields and task options")
        base = user_values.pop("recipe", None)
        recipe = recipe or base
        user_values.pop("description", None)
    task = get_task(task_name)
    recipe_path = task.recipe_path(recipe or task.default_recipe)
    doc = load_yaml_mapping(recipe_path)
    unknown = set(doc) - {"description", "task", "args"}
    if unknown:
        raise ConfigError(f"{recipe_path}: unknown section(s) {sorted(unknown)}: a recipe has description, task and args")
    arg_values = dict(doc.get("args") or {})
    arg_names, option_names = TrainingArguments.field_names(), task.option_names()
    TrainingArguments.check_keys(arg_values, source=recipe_path)
    if config:
        config_values = load_yaml_mapping(config)
        TrainingArguments.check_keys(config_values, source=config)
        arg_values.update(config_values)
    parsed = parse_overrides(overrides, arg_names + option_names)
    option_values = dict(doc.get("task") or {})
    for key, value in user_values.items():  # the user's file: over the recipe, under --field flags
        if key not in arg_names and key not in option_names:
            raise ConfigError(f"{user_file}: '{key}' is neither a TrainingArguments field nor an option of task "
                              f"{task.name} (see ptrain run {task.name} --dry_run)")
        (arg_values if key in arg_names else option_values)[key] = value
    for key, value in parsed.items():
        (arg_values if key in arg_names else option_values)[key] = value
    for key in option_values:
        if key not in option_names:
            raise ConfigError(f"{recipe_path}: unknown option '{key}' for task {task.name}: options are {', '.join(option_names)}")
    args = TrainingArguments.from_dict(arg_values, source=recipe_path)
    options = task.options_class(**coerce_fields(task.options_class, option_values))
    return task, options, args


def _cmd_run(ns, extra: List[str], argv: List[str]) -> int:
    task, options, args = resolve_run(ns.task, ns.recipe, ns.config, extra)  # validate before any heavy work
    check_launch_flags(ns)
    if ns.dry_run:
        return _run_here(task, options, args, dry_run=True)
    from .output_dir import claim_for_command

    with claim_for_command(args, ns):  # one job owns output_dir until this command's last line
        if wants_launch(ns):
            return launch_with_restarts(ns, run_target(argv), ns.log_dir or os.path.join(args.output_dir, "launch_logs"))
        return _run_here(task, options, args, dry_run=False)


def _cmd_launch(ns) -> int:
    check_launch_flags(ns)
    if not os.path.isfile(ns.script):
        raise ConfigError(f"{ns.script} does not exist: ptrain launch [launcher flags] SCRIPT [ARGS...]")
    return launch_with_restarts(ns, [ns.script, *ns.script_args], ns.log_dir or "log")


def _run_here(task, options, args, dry_run: bool) -> int:
    from . import distributed as dist
    from .trainer import Trainer

    dist.select_device(args.device)  # the launcher's card, before the task makes any tensor
    run = task.build(options, args)
    trainer = Trainer(run.model, args, train_dataset=run.train_dataset, eval_dataset=run.eval_dataset,
                      loss_fn=run.loss_fn, collate_fn=run.collate_fn, compute_metrics=run.compute_metrics,
                      callbacks=run.callbacks)
    if dry_run:
        print(f"task: {task.name}  options: {options}")
        print("info: " + json.dumps(run.info, sort_keys=True))
        print("args: " + json.dumps(args.to_dict(), sort_keys=True))
        print(trainer.describe_callbacks())
        return 0
    start = time.time()
    state = trainer.fit()
    if state.status == "preempted":
        from callbacks.preemption import Preemption

        code = trainer.callbacks.get(Preemption).exit_code
        if dist.is_main_process():
            print(f"ptrain: preempted at step {state.global_step}; checkpoint saved: resume with "
                  f"--resume_from_checkpoint auto", file=sys.stderr)
        return code
    results = {"task": task.name, "status": state.status, "global_step": state.global_step,
               "train_seconds": round(time.time() - start, 2), **run.info}
    if run.eval_dataset is not None:  # the final step already evaluated unless the strategy is 'no'
        final = trainer.state.metrics if args.evaluation_strategy != "no" and trainer.state.metrics else None
        results.update(final or trainer.evaluate())
    if run.test_dataset is not None:
        results.update(trainer.predict(run.test_dataset).metrics)
    if dist.is_main_process():
        path = os.path.join(args.output_dir, "results.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1, sort_keys=True)
        shown = {k: v for k, v in results.items() if k.endswith(("accuracy", "_loss"))}
        print(" ".join(f"{k}={v:.4f}" for k, v in sorted(shown.items())))
        extra = ", inference/" if os.path.isdir(os.path.join(args.output_dir, "inference")) else ""
        print(f"run directory: {os.path.abspath(args.output_dir)} (results.json, metrics.jsonl, checkpoints/{extra})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
