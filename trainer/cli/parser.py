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
    ptrain serve RUN/inference --port 8000            # the model over HTTP, dynamically batched
    ptrain visualdl --logdir runs/digits-demo          # the curves in VisualDL (any visualdl option)

Launcher flags (run and launch): --nproc, --gpus, --ips, --nnodes N|MIN:MAX,
--master IP:PORT|etcd://HOST:PORT, --rank, --job_id, --max_restarts,
--elastic_timeout, --log_dir (see docs/how-to/elastic.md).
A Trainer started with restarts resumes from the newest complete checkpoint
of its output_dir by itself after a restart.

Any ``--field value`` after the task name overrides a TrainingArguments field
or a task option; recipes are YAML (see docs/reference/tasks.md). Errors print one
line and exit non-zero (2 config, 3 data, 4 callback, 5 training, 1 other);
``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import textwrap

from ..launch.flags import add_launch_flags
from .serve import add_serve_parser
from .tasks import available_tasks, get_task


def _predict_inputs_help() -> str:
    """What each installed task's predict takes (its docstring), for ``ptrain predict --help``."""
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


def _add_task_options(run: argparse.ArgumentParser, name: str) -> None:
    """``ptrain run TASK --help``: the task's own options, as a group of flags (help only: parsing leaves them
    to the task's options class, which validates them)."""
    try:
        task = get_task(name, usable=False)
    except Exception:  # noqa: BLE001 - an unknown task or a recipe file: the generic help
        return
    group = run.add_argument_group(f"task options ({task.name}; also 'task:' in a recipe)")
    for option, kind, default, meaning in task.option_help():
        group.add_argument(f"--{option}", metavar=str(kind).upper().replace("OPTIONAL[", "").rstrip("]"),
                           default=argparse.SUPPRESS, help=f"{meaning} (default: {default})".replace("%", "%%"))


def build_parser(predict_help: bool = False, run_task: str = None) -> argparse.ArgumentParser:
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
    if run_task:
        _add_task_options(run, run_task)
    run.add_argument("--dry_run", action="store_true", help="print the resolved arguments and callbacks, then exit (2, with the line, where the run would be refused)")
    run.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")
    run.add_argument("--verbose", action="store_true", help="show everything the quiet console hides: INFO of "
                     "libraries, DEBUG lines, every warning, paddle's C++ log lines (docs/how-to/troubleshooting.md)")
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
    add_serve_parser(sub)
    sub.add_parser("visualdl", add_help=False, help="serve a run's curves: visualdl --logdir OUTPUT_DIR [its options], "
                   "answering requests without Accept-Language too (docs/how-to/monitor.md)")
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
