"""The PaddleNLP spellings ``TrainingArguments`` accepts, turned into the
project's one name per option, and the checks that span several fields.

Called from ``TrainingArguments.__post_init__`` only (the one place where
arguments are validated):

- ``fp16`` / ``bf16`` -> ``amp`` fp16 / bf16; ``fp16_opt_level`` -> ``amp_level``;
- ``report_to`` ``none`` -> no logger, ``all`` -> the default loggers and every tracker installed
  (tensorboard, wandb, mlflow);
- ``max_grad_norm`` 0 -> None (no clipping);
- ``resume_from_checkpoint`` True / ``true`` -> ``auto``, False -> None;
- ``device`` ``auto`` -> ``gpu`` or ``cpu`` (what ``paddle.set_device`` takes);
- ``load_best_model_at_end`` needs an evaluation, saves at the evaluations'
  steps, and a metric (``eval_loss`` when none is given, as in PaddleNLP).

    >>> from trainer.args import TrainingArguments
    >>> a = TrainingArguments(fp16=True, fp16_opt_level="O2", report_to=["none"], max_grad_norm=0)
    >>> (a.amp, a.amp_level, a.report_to, a.max_grad_norm)
    ('fp16', 'O2', [], None)
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, List

from ..errors import ConfigError, option

REPORTERS = ("tqdm", "jsonl", "visualdl", "png")
TRACKERS = ("tensorboard", "wandb", "mlflow")  # callbacks.tracking: one callback each, an optional extra each
DEFAULT_REPORTERS = ("tqdm", "jsonl", "visualdl")


def normalize_aliases_before(args) -> None:
    """Values the type coercion would refuse (a bool for a str field)."""
    if isinstance(args.per_device_train_batch_size, str) and args.per_device_train_batch_size.strip().lower() == "auto":
        args.per_device_train_batch_size = 8  # the field's default as the start; halved after an out-of-memory
        args.auto_find_batch_size = True
    resume = args.resume_from_checkpoint
    if resume is True or (isinstance(resume, str) and resume.strip().lower() in ("true", "yes", "1")):
        args.resume_from_checkpoint = "auto"
    elif resume is False or (isinstance(resume, str) and resume.strip().lower() in ("false", "no", "0")):
        args.resume_from_checkpoint = None


def normalize_aliases_after(args) -> None:
    if args.fp16 and args.bf16:
        raise ConfigError(f"fp16 and bf16 are both set: choose one (or {option('amp', 'fp16')} or {option('amp', 'bf16')})")
    for flag in ("fp16", "bf16"):
        if getattr(args, flag):
            if args.amp not in ("off", flag):
                raise ConfigError(f"{flag}=True but amp={args.amp!r}: set one of them ({option('amp', flag)})")
            args.amp = flag
    if args.fp16_opt_level is not None:
        args.fp16_opt_level = args.fp16_opt_level.strip().upper()
        if args.fp16_opt_level not in ("O1", "O2"):
            raise ConfigError(f"fp16_opt_level={args.fp16_opt_level!r} is not allowed: choose O1 or O2")
        args.amp_level = args.fp16_opt_level
    args.report_to = _reporters(args.report_to)
    if args.max_grad_norm == 0:
        args.max_grad_norm = None
    if args.device == "auto":
        args.device = _auto_device()
        args._device_was_auto = True  # not a field: the device line says "auto", not "asked for"


def _reporters(values: Iterable[str]) -> List[str]:
    out: List[str] = []
    for value in values:
        word = str(value).strip().lower() if isinstance(value, str) else value
        if word == "none":
            continue
        if word == "all":  # as PaddleNLP's: the default loggers and every tracker installed
            out.extend(r for r in DEFAULT_REPORTERS + tuple(t for t in TRACKERS if _installed(t)) if r not in out)
        elif word not in out:
            out.append(word)
    return out


def _installed(tracker: str) -> bool:
    """Whether a tracker's library can be imported (asked without importing it)."""
    import importlib.util

    modules = {"tensorboard": ("tensorboardX", "tensorboard")}.get(tracker, (tracker,))
    return any(importlib.util.find_spec(m) is not None for m in modules)


def _auto_device() -> str:
    import paddle

    if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        return "gpu"
    return "cpu"


def validate_best_model(args) -> None:
    """``load_best_model_at_end`` needs evaluations, checkpoints at those steps and a metric."""
    if not args.load_best_model_at_end:
        return
    if args.evaluation_strategy == "no":
        raise ConfigError(f"load_best_model_at_end needs evaluations: set {option('evaluation_strategy', 'steps')} or "
                          f"{option('evaluation_strategy', 'epoch')}")
    if args.save_strategy != args.evaluation_strategy:
        raise ConfigError(f"load_best_model_at_end needs a checkpoint at every evaluation: set "
                          f"{option('save_strategy', args.evaluation_strategy)} (it is {args.save_strategy})")
    if args.save_strategy == "steps" and args.eval_steps and args.save_steps % args.eval_steps:
        raise ConfigError(f"load_best_model_at_end needs save_steps ({args.save_steps}) to be a multiple of "
                          f"eval_steps ({args.eval_steps})")
    if args.metric_for_best_model is None:
        args.metric_for_best_model = "loss"


def config_lines(args, key: str = "") -> List[str]:
    """``print_config``'s lines: a header, then ``name: value`` for every field."""
    title = f"{key.capitalize() or type(args).__name__} Configuration Arguments"
    lines = ["-" * 60, title]
    names = [f.name for f in dataclasses.fields(args)] if dataclasses.is_dataclass(args) else sorted(vars(args))
    for name in names:
        lines.append(f"{name:<30}: {getattr(args, name)}")
    lines.append("")
    return lines
