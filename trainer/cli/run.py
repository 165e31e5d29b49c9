"""``ptrain run`` in this process: a task's run resolved from its recipe, --config and --field flags, then
trained, evaluated and reported; and the script paddle's launcher runs for it on every process."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import List, Optional

from ..args import TrainingArguments, coerce_fields, load_yaml_mapping, parse_overrides
from ..errors import ConfigError
from ..launch.flags import LAUNCH_FLAGS, drop_flags
from .tasks import get_task


def run_target(argv: List[str]) -> List[str]:
    """What the launcher runs for ``ptrain run ...``: this command again, without the launcher flags."""
    return [os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_entry.py")] + drop_flags(argv, LAUNCH_FLAGS)


def resolve_run(task_name: str, recipe: Optional[str], config: Optional[str], overrides: List[str]):
    """Task, options and TrainingArguments for a run: recipe < --config < --field overrides."""
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

def run_here(task, options, args, dry_run: bool) -> int:
    from callbacks.tracking import log_file

    from .. import distributed as dist  # paddle and the loop load here, after the cheap checks
    from ..trainer import Trainer

    dist.select_device(args.requested_device)  # the launcher's card, before the task makes any tensor
    # a dry run builds no data when the task can leave it out (trainer.task: Task.dry_build)
    run = (task.dry_build if dry_run and task.dry_build is not None else task.build)(options, args)
    # ptrain is the script: it trains, evaluates when there is an evaluation set, predicts on a test set
    # (a dry run of a task that leaves its data out says what the arguments ask for instead)
    dry = dry_run and task.dry_build is not None
    made = _missing_dirs(args.output_dir) if dry_run else []  # what Trainer(...) makes; a dry run leaves nothing
    args.do_train = True
    args.do_eval = run.eval_dataset is not None or (dry and args.evaluation_strategy != "no")
    args.do_predict = run.test_dataset is not None
    trainer = Trainer(run.model, args, train_dataset=run.train_dataset, eval_dataset=run.eval_dataset,
                      loss_fn=run.loss_fn, collate_fn=run.collate_fn, compute_metrics=run.compute_metrics,
                      callbacks=run.callbacks)
    trainer.run_identity = task.run_identity(options)  # the task's options: compared on resume like the args
    if dry_run:
        print(f"task: {task.name}  options: {options}")
        print("info: " + json.dumps(run.info, sort_keys=True))  # one JSON object: scripts read it
        if task.dry_build is not None:
            print("(datasets not built for a dry run)")
        print("args: " + json.dumps(args.to_dict(), sort_keys=True))
        print(trainer.describe_callbacks())
        for path in made:  # deepest first; only while still empty
            with contextlib.suppress(OSError):
                os.rmdir(path)
        from ..checkpoint.output_dir import earlier_run, reuse_refusal

        others = [] if args.overwrite_output_dir else earlier_run(args.output_dir, "", args.resume_from_checkpoint)
        if others:  # what the run itself would say at once: the dry run says it too, with its exit code
            print(f"ptrain: the run would be refused: {reuse_refusal(args.output_dir, others)}", file=sys.stderr)
            return ConfigError.exit_code
        return 0
    state = trainer.fit()
    if state.status == "preempted":
        if dist.is_main_process():
            print(preempted_line(args, state), file=sys.stderr)
        return state.exit_code
    results = {"task": run.info.get("task", task.name), "status": state.status, "global_step": state.global_step,
               **state.train_metrics, **run.info}
    if run.eval_dataset is not None:  # the final step already evaluated unless the strategy is 'no'
        final = trainer.state.metrics if args.evaluation_strategy != "no" and trainer.state.metrics else None
        results.update(final or trainer.evaluate())
    if run.test_dataset is not None:
        results.update(trainer.predict(run.test_dataset).metrics)
    if not args.skip_memory_metrics:  # every rank's peaks, in rank order (a collective: before the rank-0 write)
        from ..memory_stats import peak_memory_per_rank
        results["peak_memory_per_rank"] = peak_memory_per_rank()
    if dist.is_main_process():
        from ..checkpoint import fence
        from ..checkpoint.output_dir import RESULTS_FILE

        path = os.path.join(args.output_dir, RESULTS_FILE)
        with fence.fenced(args.output_dir):  # only while output_dir is still this run's (lease not taken over)
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                json.dump(results, f, indent=1, sort_keys=True)
            os.replace(path + ".tmp", path)
        log_file(trainer, path)  # into the trackers' runs (report_to tensorboard, wandb, mlflow)
        shown = {k: v for k, v in results.items() if k.endswith(("accuracy", "_loss"))}
        print(" ".join(f"{k}={v:.4f}" for k, v in sorted(shown.items())))
        print(f"run directory: {os.path.abspath(args.output_dir)} ({', '.join(run_files(args.output_dir))})")
    return 0


#: what a run may leave in its output_dir, in the order the closing line names them (folders with a slash)
RUN_FILES = ("results.json", "metrics.jsonl", "checkpoints/", "inference/", "visualdl/", "curves.png",
             "tensorboard/", "wandb/", "mlflow.db", "launch_logs/")


def run_files(output_dir: str) -> List[str]:
    """The entries of :data:`RUN_FILES` that are in ``output_dir`` now: the closing line names only those."""
    return [name for name in RUN_FILES
            if (os.path.isdir if name.endswith("/") else os.path.isfile)(os.path.join(output_dir, name.rstrip("/")))]


def _missing_dirs(path: str) -> List[str]:
    """``path`` and its ancestors that do not exist yet, deepest first."""
    out, path = [], os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        out.append(path)
        path = os.path.dirname(path)
    return out


def preempted_line(args, state) -> str:
    """The exit line of a preempted run: what is on disk, exactly, and what to do next."""
    from ..checkpoint.store import on_disk
    from ..process import REQUEUE_EXIT

    saved, what = on_disk(args.output_dir, state.global_step)
    why = "" if args.save_on_preemption else " (--save_on_preemption false)"
    then = ("resume with --resume_from_checkpoint auto" if saved else
            "--resume_from_checkpoint auto would start fresh")
    if state.exit_code == REQUEUE_EXIT:
        then = f"requeue the job (exit {REQUEUE_EXIT}; Slurm: scontrol requeue $SLURM_JOB_ID) and " + then
    return f"ptrain: preempted at step {state.global_step}; {what}{why}: {then}"
