"""PaddleNLP's or PaddleFormers' ``TrainingArguments`` (or a subclass such as
``CompressionArguments`` or ``SFTConfig``) -> ours, field by field.

``FIELDS`` (``trainer.args.fields_table``; PaddleFormers': ``trainer.args.paddleformers_fields``) is the
migration table: for every field of their dataclass, how it maps here. Kinds:

- ``same``: same name and meaning;
- ``renamed``: carried to the field named in the note;
- ``default``: same name, a different default here (the conversion carries
  PaddleNLP's value, so a converted run behaves as PaddleNLP's);
- ``ignored``: accepted, with PaddleNLP's name, type and default
  (``trainer.args.paddlenlp_fields``), but has no effect on training here
  (the note says why); a value other than PaddleNLP's default is named in one
  warning;
- ``unsupported``: likewise accepted without an effect, for a feature this
  project does not have (the note says why); a set value is warned about the
  same way.

A field of a subclass (``CompressionArguments``' own) that has no counterpart
here is named in one warning too.

PaddleFormers renamed PaddleNLP's parallel fields (``RENAMED``: ``tensor_model_parallel_size`` ->
``tensor_parallel_degree``...) and replaced the ``recompute`` switch by ``recompute_granularity`` (any value
turns ours on; ``recompute_method``/``recompute_num_layers``/``recompute_modules`` are warned about: ours
recomputes every block, through the model's own ``enable_recompute`` switch as its Trainer does).
Its ``sharding`` after its ``__post_init__`` is what it runs: ``[]`` on one process, ``stage1`` by default on
several; carried as it is, so a converted run shards as PaddleFormers' would.

``docs/how-to/migrate-paddlenlp.md`` shows this table; a test fails when a
field of the installed paddlenlp is missing from it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Any

from ..args import REPORTERS, TRACKERS, TrainingArguments
from ..args.fields_table import FIELDS as PADDLENLP_FIELDS
from ..errors import ConfigError

logger = logging.getLogger("trainer")

# fields PaddleNLP's schedule reads from the paddlenlp arguments themselves (trainer.compat.paddlenlp_recipe):
# they act on a converted run, so they are neither carried to ours nor warned about
RECIPE_FIELDS = ("num_cycles", "lr_end", "power")

# the PaddleNLP name -> ours, for renamed fields carried by value
_RENAMED = {"fp16": "fp16", "bf16": "bf16", "fp16_opt_level": "fp16_opt_level"}


# PaddleFormers' fields read from its arguments themselves, by its recipe (trainer.compat.paddleformers_recipe) or the
# callback adapter (save_hf_steps, save_checkpoint_format: trainer.compat.paddlenlp_callbacks; our checkpoints are
# always unified safetensors): they act, unwarned
PF_READ_FIELDS = ("min_lr", "freeze_training", "dataloader_shuffle", "save_hf_steps", "save_checkpoint_format")

# PaddleFormers' recompute fields: recompute_granularity switches ours on; these change what is recomputed there,
# not here (ours recomputes every block, or recompute_modules)
# (its recompute_modules names kinds of submodule, "mlp", "core_attn"; ours names sublayers by path or class)
PF_RECOMPUTE_DETAIL = ("recompute_method", "recompute_num_layers", "recompute_modules")


def _tables(origin: str):
    """(FIELDS, RENAMED, guide) of ``origin``'s migration table."""
    if origin == "paddleformers":
        from ..args.paddleformers_fields import FIELDS, RENAMED

        return FIELDS, RENAMED, "docs/how-to/migrate-paddleformers.md"
    return PADDLENLP_FIELDS, {}, "docs/how-to/migrate-paddlenlp.md"


def convert_args(pargs: Any, origin: str = "paddlenlp"):
    """Our ``TrainingArguments`` from a paddlenlp (or paddleformers) one; warns once naming every set field that
    has no counterpart."""
    fields, renamed, guide = _tables(origin)
    ours = set(TrainingArguments.field_names())
    values: dict = {}
    dropped = []
    reference = _reference(pargs)
    for f in dataclasses.fields(pargs):
        if not f.init:
            continue
        name, value = f.name, getattr(pargs, f.name)
        kind = fields.get(name, ("unsupported", f"not a {origin} TrainingArguments field"))[0]
        if name == "local_rank":
            continue  # ours reads the launcher's environment itself
        if name in RECIPE_FIELDS or (origin == "paddleformers" and name in PF_READ_FIELDS):
            continue  # read from their arguments by their recipe (trainer.compat.paddlenlp_recipe)
        if name in renamed:
            if renamed[name] in ours and int(value or -1) > 1:  # their -1/1 = off: ours keeps its own default
                values[renamed[name]] = int(value)
            elif _is_set(f, value, reference) and renamed[name] not in ours:
                dropped.append(name)
            continue
        if origin == "paddleformers" and name == "recompute_granularity":
            values["recompute"] = value is not None
            continue
        if origin == "paddleformers" and name == "split_param":
            continue  # carried below, as a word of sharding_parallel_config (PaddleNLP's spelling, and ours)
        if origin == "paddleformers" and name in PF_RECOMPUTE_DETAIL:
            if value is not None:
                dropped.append(name)
            continue
        if kind in ("same", "default", "renamed") and name in ours and name != "logging_dir":
            values[name] = _plain(value)
        elif name in ours:  # a field without an effect here: carried when set (ours then names it in a warning)
            if _is_set(f, value, reference):
                values[name] = _plain(value)
        elif _is_set(f, value, reference):
            dropped.append(name)
    for f in dataclasses.fields(TrainingArguments):  # their __post_init__ splits some strings into lists (PaddleFormers'
        if isinstance(values.get(f.name), list) and isinstance(f.default, str):  # unified_checkpoint_config)
            values[f.name] = " ".join(str(v) for v in values[f.name] if v)
    if origin == "paddleformers" and getattr(pargs, "split_param", False) and "stage1" in str(values.get("sharding")):
        words = str(values.get("sharding_parallel_config") or "").split()
        values["sharding_parallel_config"] = " ".join(words + ["split_param"] * ("split_param" not in words))
    # PaddleNLP's device default is gpu even without one: gpu here means "the GPU when there is one"
    values["device"] = "cpu" if values.get("device") == "cpu" else "auto"
    report_to = values.get("report_to")
    if report_to is not None:
        known = REPORTERS + TRACKERS + ("none", "all")
        report_to = [report_to] if isinstance(report_to, str) else list(report_to)
        dropped += [f"report_to:{r}" for r in report_to if r not in known]
        values["report_to"] = [r for r in report_to if r in known] or ["none"]
    if values.get("eval_steps") is None:
        values["eval_steps"] = values.get("logging_steps", 0)  # PaddleNLP's rule for an unset eval_steps
    if values.get("report_to") is None:
        values["report_to"] = ["visualdl"]
    values["flush_at_end"] = False  # the last step is like any other, as in PaddleNLP
    if values.get("disable_tqdm") is None:
        values["disable_tqdm"] = False
    if dropped:
        logger.warning("these %s TrainingArguments have no counterpart here and are ignored: %s (see %s)",
                       origin, ", ".join(_describe(pargs, n) for n in dropped), guide)
    try:
        return TrainingArguments(**values)
    except ConfigError as exc:  # a refusal names their fields, as the script set them
        if not renamed:
            raise
        message = str(exc)
        for theirs, name in renamed.items():
            message = re.sub(rf"\b{name}\b", theirs, message)
        raise type(exc)(message) from None


def _describe(pargs, name: str) -> str:
    if name.startswith("report_to:"):
        return f"report_to {name.split(':', 1)[1]}"
    return f"{name}={getattr(pargs, name)!r}"


def _plain(value):
    """Enum members (IntervalStrategy, SchedulerType, OptimizerNames) as their string values."""
    if hasattr(value, "value") and isinstance(getattr(value, "value"), str):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _reference(pargs):
    """The same class with defaults only, as its __post_init__ leaves them (it fills some fields itself)."""
    attempts = [{}]
    if hasattr(pargs, "amp_master_grad"):  # PaddleFormers' default (True) raises without AMP: its CPU defaults
        attempts.append({"amp_master_grad": pargs.amp_master_grad, "bf16": pargs.bf16, "fp16": pargs.fp16})
    for extra in attempts:
        try:
            return type(pargs)(output_dir=pargs.output_dir, **extra)
        except Exception:  # noqa: BLE001, S112 - a subclass with other required fields: the declared defaults
            continue
    return None


def _is_set(f: dataclasses.Field, value, reference) -> bool:
    """Whether ``value`` differs from the default (so dropping it changes the run). A value equal to the declared
    default is not set, whatever ``__post_init__`` made of the reference's (it derives some from others)."""
    declared = f.default if f.default is not dataclasses.MISSING else dataclasses.MISSING
    if declared is not dataclasses.MISSING and _plain(value) == _plain(declared):
        return False
    if f.name == "logging_dir" and reference is not None and value is not None:  # PaddleNLP's own, time-stamped
        return os.path.dirname(str(value)) != os.path.dirname(str(reference.logging_dir or ""))
    if reference is not None:
        default = getattr(reference, f.name, None)
    elif f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        default = f.default_factory()  # type: ignore[misc]
    else:
        return True
    return _plain(value) != _plain(default)
