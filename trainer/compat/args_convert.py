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

PaddleFormers' table (``trainer.args.paddleformers_fields``) has three kinds more: ``recipe`` (read from its
arguments by its recipe or the callback adapter: never carried, never warned), ``script`` (read by the script or
the model's config, under PaddleFormers too: left alone) and ``refused`` (a set value is refused in one line naming
the field and why, before anything is built). It renamed PaddleNLP's parallel fields (``RENAMED``:
``tensor_model_parallel_size`` -> ``tensor_parallel_degree``...), replaced the ``recompute`` switch by
``recompute_granularity`` (any value turns ours on; ``recompute_method``/``recompute_num_layers``/
``recompute_modules`` are the model config's, ``script``), and spells PaddleNLP's ``*_parallel_config`` words as
switches (``SWITCHES``: each adds its word where its layout runs).
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
from ..args.paddleformers_fields import CARRIED, LLM_META, SWITCHES
from ..args.paddleformers_fields import FIELDS as PADDLEFORMERS_FIELDS
from ..args.paddleformers_fields import RENAMED as PADDLEFORMERS_RENAMED
from ..errors import ConfigError

logger = logging.getLogger("trainer")

# fields PaddleNLP's schedule reads from the paddlenlp arguments themselves (trainer.compat.paddlenlp_recipe):
# they act on a converted run, so they are neither carried to ours nor warned about
RECIPE_FIELDS = ("num_cycles", "lr_end", "power")


def _tables(origin: str):
    """(FIELDS, RENAMED, guide) of ``origin``'s migration table."""
    if origin == "paddleformers":
        return ({**{name: ("script", "") for name in LLM_META}, **PADDLEFORMERS_FIELDS}, PADDLEFORMERS_RENAMED,
                "docs/how-to/migrate-paddleformers.md")
    return PADDLENLP_FIELDS, {}, "docs/how-to/migrate-paddlenlp.md"


def _is_refused(name: str, value, f: dataclasses.Field) -> bool:
    """A ``refused`` row's value that cannot be honoured: for a ``*_size`` degree, anything but -1 and 1 (off);
    otherwise anything but the declared default."""
    if name.endswith("_size"):
        return value not in (None, -1, 0, 1)
    return f.default is not dataclasses.MISSING and _plain(value) != _plain(f.default)


def _switch_words(pargs, values: dict) -> None:
    """PaddleFormers' switches (``SWITCHES``) as words of our ``*_parallel_config`` strings, for the layouts the run
    has (PaddleFormers reads each only where its layout runs; so do we)."""
    active = {"sharding_parallel_config": any(s in str(values.get("sharding") or "") for s in ("stage1", "stage2")),
              "tensor_parallel_config": int(values.get("tensor_parallel_degree") or 1) > 1,
              "pipeline_parallel_config": int(values.get("pipeline_parallel_degree") or 1) > 1}
    for name, (field_name, word, when) in SWITCHES.items():
        if active[field_name] and hasattr(pargs, name) and bool(getattr(pargs, name)) == when:
            words = str(values.get(field_name) or "").split()
            values[field_name] = " ".join(words + [word] * (word not in words))


def convert_args(pargs: Any, origin: str = "paddlenlp"):
    """Our ``TrainingArguments`` from a paddlenlp (or paddleformers) one; warns once naming every set field that
    has no counterpart."""
    fields, renamed, guide = _tables(origin)
    ours = set(TrainingArguments.field_names())
    values: dict = {}
    dropped, refused = [], []
    reference = _reference(pargs)
    carried = CARRIED if origin == "paddleformers" else {}
    for f in dataclasses.fields(pargs):
        if not f.init:
            continue
        name, value = f.name, getattr(pargs, f.name)
        kind = fields.get(name, ("unsupported", f"not a {origin} TrainingArguments field"))[0]
        if name == "local_rank":
            continue  # ours reads the launcher's environment itself
        if name in RECIPE_FIELDS or kind in ("recipe", "script"):
            continue  # read from their arguments by their recipe or callback adapter, or by the script: never warned
        if kind == "refused":
            if _is_refused(name, value, f):
                refused.append(name)
            continue
        if name in renamed:
            if renamed[name] in ours and int(value or -1) > 1:  # their -1/1 = off: ours keeps its own default
                values[renamed[name]] = int(value)
            elif _is_set(f, value, reference) and renamed[name] not in ours:
                dropped.append(name)
            continue
        if origin == "paddleformers" and name in SWITCHES:
            continue  # carried below, as a word of our *_parallel_config (PaddleNLP's spelling, and ours)
        if name in carried:  # recompute_granularity (any value: its Trainer recomputes), ddp_find_unused_parameters
            values[carried[name]] = value is not None and value is not False
            continue
        if origin == "paddleformers" and name == "amp_master_grad":  # its default, True, means something with O2 only
            values[name] = bool(value) and pargs.fp16_opt_level == "O2" and bool(pargs.bf16 or pargs.fp16)
            continue
        if kind in ("same", "default", "renamed") and name in ours and name != "logging_dir":
            values[name] = _plain(value)
        elif name in ours and origin == "paddlenlp":  # PaddleNLP's field without an effect here: carried when set
            if _is_set(f, value, reference):           # (ours then names it in its warning, as for our own arguments)
                values[name] = _plain(value)
        elif _is_set(f, value, reference):
            dropped.append(name)
    for f in dataclasses.fields(TrainingArguments):  # their __post_init__ splits some strings into lists (PaddleFormers'
        if isinstance(values.get(f.name), list) and isinstance(f.default, str):  # unified_checkpoint_config)
            values[f.name] = " ".join(str(v) for v in values[f.name] if v)
    if refused:
        raise ConfigError("; ".join(f"{_describe(pargs, n)}: {fields[n][1]}" for n in refused) +
                          f" (leave {'it' if len(refused) == 1 else 'them'} unset; {guide})")
    if origin == "paddleformers":
        _switch_words(pargs, values)
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
        notes = {n: fields[n][1] for n in dropped if origin == "paddleformers" and n in fields and fields[n][1]}
        logger.warning("these %s TrainingArguments have no counterpart here and are ignored: %s (see %s)", origin,
                       ", ".join(_describe(pargs, n) + (f" ({notes[n]})" if n in notes else "") for n in dropped), guide)
    try:
        return TrainingArguments(**values)
    except ConfigError as exc:  # a refusal names their fields, as the script set them
        if not renamed:
            raise
        raise type(exc)(_in_their_words(str(exc), renamed)) from None


def _in_their_words(message: str, renamed: dict) -> str:
    """A refusal of ours in PaddleFormers' terms: its parallel sizes, and its switches for our ``*_parallel_config``
    words (``drop split_param from sharding_parallel_config`` -> ``set split_param=False``)."""
    words = {word: (name, when) for name, (_, word, when) in SWITCHES.items()}

    def switches(found: list, negate: bool) -> str:
        return " and ".join(f"{words[w][0]}={words[w][1] != negate}" for w in found)

    def drop(match):
        found = match.group(1).split(" and ")
        return "set " + switches(found, True) if all(w in words for w in found) else match.group(0)

    def given(match):
        found = match.group(2).split()
        return switches(found, False) if found and all(w in words for w in found) else match.group(0)

    message = re.sub(r"drop (\w+(?: and \w+)*) from \w+_parallel_config", drop, message)
    message = re.sub(r"\b(\w+_parallel_config)=[\"']([^\"']*)[\"']", given, message)
    for theirs, name in renamed.items():
        message = re.sub(rf"\b{name}\b", theirs, message)
    return message


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
