"""PaddleNLPFields: the fields of paddlenlp 2.8.1's ``TrainingArguments`` that this
project has no option of its own for, with PaddleNLP's names, types and defaults.

``trainer.TrainingArguments`` inherits them, so a PaddleNLP script that parses
our arguments with ``PdArgumentParser`` and then reads, say,
``training_args.lazy_data_processing`` or ``training_args.logging_dir`` gets
PaddleNLP's value instead of an ``AttributeError``. (The parallel fields,
``tensor_parallel_degree``, ``pipeline_parallel_degree``, their ``*_config`` and
``hybrid_parallel_topo_order``, are ``TrainingArguments``' own, beside ``sharding``:
the Layout plans them.) These have an effect here:
``no_cuda`` (true: ``device cpu``), ``local_rank`` (filled from the launcher's
environment, as PaddleNLP does), ``sharding_degree`` (PaddleNLP's older name of
``sharding_parallel_degree``), ``logging_dir``, ``run_name`` and ``wandb_api_key``
(the trackers), ``unified_checkpoint_config`` (``async_save``: ``save_async``), and
``save_sharded_model``, ``load_sharded_model``, ``unified_checkpoint``, which ask
for what checkpoints always do here (``trainer.checkpoint.shards``): never a warning. A
``*_degree`` of 1 or -1 never warns. ``eval_accumulation_steps`` (read by
``trainer.evaluation``) and ``skip_memory_metrics`` (read by the loop's logging)
act too. Every other one has none: setting it to a value
other than its default is named in one warning (once per field and process),
and the migration table (``python -m trainer.compat.table``,
docs/how-to/migrate-paddlenlp.md) marks it so, with the reason from
``trainer.args.fields_table.FIELDS``. They never block a resume.

Imports only the standard library, ``trainer.errors`` and ``fields_table`` (data).
"""

from __future__ import annotations

import logging
import os
from dataclasses import MISSING as _MISSING, dataclass, field, fields
from typing import List, Optional

from ..errors import ConfigError
from .fields_table import FIELDS

logger = logging.getLogger("trainer")

#: the fields below that change something here; every other one has no effect
WITH_EFFECT = ("no_cuda", "local_rank", "sharding_degree", "eval_accumulation_steps", "skip_memory_metrics", "logging_dir", "run_name", "wandb_api_key",
               # what these ask for is what checkpoints always do here (trainer.checkpoint.shards)
               "save_sharded_model", "load_sharded_model", "unified_checkpoint", "unified_checkpoint_config")
#: unified_checkpoint_config's words (PaddleNLP 2.8.1)
UNIFIED_CHECKPOINT_CONFIGS = ("skip_save_model_weight", "master_weight_compatible", "async_save", "enable_all_options")


def _no_effect(name: str) -> dict:
    note = FIELDS[name][1]
    # only "help": PdArgumentParser passes metadata to argparse as keywords
    return {"help": f"PaddleNLP's field, no effect here: {note}" if name not in WITH_EFFECT else f"PaddleNLP's field: {note}"}


@dataclass
class PaddleNLPFields:
    """PaddleNLP-only fields, a dataclass base of :class:`trainer.TrainingArguments`."""

    prediction_loss_only: bool = field(default=False, metadata=_no_effect("prediction_loss_only"))
    eval_accumulation_steps: Optional[int] = field(default=None, metadata=_no_effect("eval_accumulation_steps"))
    num_cycles: float = field(default=0.5, metadata=_no_effect("num_cycles"))
    lr_end: float = field(default=1e-07, metadata=_no_effect("lr_end"))
    power: float = field(default=1.0, metadata=_no_effect("power"))
    log_on_each_node: bool = field(default=True, metadata=_no_effect("log_on_each_node"))
    logging_dir: Optional[str] = field(default=None, metadata=_no_effect("logging_dir"))
    save_on_each_node: bool = field(default=False, metadata=_no_effect("save_on_each_node"))
    no_cuda: bool = field(default=False, metadata=_no_effect("no_cuda"))
    bf16_full_eval: bool = field(default=False, metadata=_no_effect("bf16_full_eval"))
    fp16_full_eval: bool = field(default=False, metadata=_no_effect("fp16_full_eval"))
    amp_custom_black_list: Optional[List[str]] = field(default=None, metadata=_no_effect("amp_custom_black_list"))
    amp_custom_white_list: Optional[List[str]] = field(default=None, metadata=_no_effect("amp_custom_white_list"))
    sharding_degree: int = field(default=-1, metadata=_no_effect("sharding_degree"))
    save_sharded_model: bool = field(default=False, metadata=_no_effect("save_sharded_model"))
    load_sharded_model: bool = field(default=False, metadata=_no_effect("load_sharded_model"))
    sep_parallel_degree: int = field(default=-1, metadata=_no_effect("sep_parallel_degree"))
    data_parallel_config: str = field(default='', metadata=_no_effect("data_parallel_config"))
    scale_loss: float = field(default=32768, metadata=_no_effect("scale_loss"))
    minimum_eval_times: Optional[int] = field(default=None, metadata=_no_effect("minimum_eval_times"))
    local_rank: int = field(default=-1, metadata=_no_effect("local_rank"))
    max_evaluate_steps: int = field(default=-1, metadata=_no_effect("max_evaluate_steps"))
    past_index: int = field(default=-1, metadata=_no_effect("past_index"))
    run_name: Optional[str] = field(default=None, metadata=_no_effect("run_name"))
    ignore_data_skip: bool = field(default=False, metadata=_no_effect("ignore_data_skip"))
    wandb_api_key: Optional[str] = field(default=None, metadata=_no_effect("wandb_api_key"))
    skip_memory_metrics: bool = field(default=True, metadata=_no_effect("skip_memory_metrics"))
    flatten_param_grads: Optional[bool] = field(default=False, metadata=_no_effect("flatten_param_grads"))
    lazy_data_processing: Optional[bool] = field(default=True, metadata=_no_effect("lazy_data_processing"))
    skip_profile_timer: Optional[bool] = field(default=True, metadata=_no_effect("skip_profile_timer"))
    distributed_dataloader: Optional[bool] = field(default=False, metadata=_no_effect("distributed_dataloader"))
    unified_checkpoint: Optional[bool] = field(default=False, metadata=_no_effect("unified_checkpoint"))
    to_static: Optional[bool] = field(default=False, metadata=_no_effect("to_static"))
    unified_checkpoint_config: Optional[str] = field(default='', metadata=_no_effect("unified_checkpoint_config"))
    ignore_load_lr_and_optim: Optional[bool] = field(default=False, metadata=_no_effect("ignore_load_lr_and_optim"))
    ignore_save_lr_and_optim: Optional[bool] = field(default=False, metadata=_no_effect("ignore_save_lr_and_optim"))
    force_reshard_pp: Optional[bool] = field(default=False, metadata=_no_effect("force_reshard_pp"))
    enable_auto_parallel: Optional[bool] = field(default=False, metadata=_no_effect("enable_auto_parallel"))
    use_expert_parallel: Optional[bool] = field(default=False, metadata=_no_effect("use_expert_parallel"))


_warned: set = set()


def no_effect_fields() -> List[str]:
    """The names of the fields above that change nothing here."""
    return [f.name for f in fields(PaddleNLPFields) if f.name not in WITH_EFFECT]


def apply_paddlenlp_fields(args) -> None:
    """From ``TrainingArguments.__post_init__``: the fields with an effect, and one warning per field set
    to a value other than PaddleNLP's default that has none."""
    if args.no_cuda:
        args.device = "cpu"
    if args.local_rank == -1 and int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) > 1:
        args.local_rank = int(os.environ.get("PADDLE_RANK_IN_NODE", os.environ.get("PADDLE_LOCAL_RANK", "-1")))
    if args.sharding_degree != -1 and args.sharding_parallel_degree == -1:  # PaddleNLP's older name
        args.sharding_parallel_degree = args.sharding_degree
    words = str(args.unified_checkpoint_config or "").replace(",", " ").split()
    unknown = [w for w in words if w not in UNIFIED_CHECKPOINT_CONFIGS]
    if unknown:
        raise ConfigError(f"unified_checkpoint_config={args.unified_checkpoint_config!r}: {', '.join(unknown)} is not "
                          f"known: use any of {', '.join(UNIFIED_CHECKPOINT_CONFIGS)}")
    if {"async_save", "enable_all_options"} & set(words):
        args.save_async = True
    for f in fields(PaddleNLPFields):
        if f.default == "" and getattr(args, f.name) is None:  # the type coercion reads "" of Optional[str] as None
            setattr(args, f.name, "")
    set_now = [f for f in fields(PaddleNLPFields) if f.name not in WITH_EFFECT and f.name not in _warned
               and getattr(args, f.name) != (f.default if f.default_factory is _MISSING else f.default_factory())
               and not (f.name.endswith("_degree") and getattr(args, f.name) in (1, -1))]  # a degree of 1 is "off"
    if set_now:
        _warned.update(f.name for f in set_now)
        logger.warning("%s: PaddleNLP field%s without an effect here, ignored (docs/how-to/migrate-paddlenlp.md)",
                       ", ".join(f"{f.name}={getattr(args, f.name)!r} ({FIELDS[f.name][1]})" for f in set_now),
                       "s" if len(set_now) > 1 else "")
