"""PaddleNLP ``TrainingArguments`` (or a subclass such as
``CompressionArguments``) -> ours, field by field.

``FIELDS`` is the migration table: for every field of PaddleNLP's dataclass,
how it maps here. Kinds:

- ``same``: same name and meaning;
- ``renamed``: carried to the field named in the note;
- ``default``: same name, a different default here (the conversion carries
  PaddleNLP's value, so a converted run behaves as PaddleNLP's);
- ``ignored``: accepted, with PaddleNLP's name, type and default
  (``trainer.compat.paddlenlp_fields``), but has no effect on training here
  (the note says why); a value other than PaddleNLP's default is named in one
  warning;
- ``unsupported``: likewise accepted without an effect, for a feature this
  project does not have (the note says why); a set value is warned about the
  same way.

A field of a subclass (``CompressionArguments``' own) that has no counterpart
here is named in one warning too.

``docs/how-to/migrate-paddlenlp.md`` shows this table; a test fails when a
field of the installed paddlenlp is missing from it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Dict, Tuple

logger = logging.getLogger("trainer")

_HYBRID = "hybrid parallelism (sharding, tensor/pipeline/sep parallel) is not supported: data parallel only"
_AUTO = "auto parallel and static-graph training are not supported: dynamic-graph data parallel only"
_UC = "checkpoints have one format here (safetensors + manifest, trainer.checkpoint)"

FIELDS: Dict[str, Tuple[str, str]] = {
    "output_dir": ("default", "default output (required in PaddleNLP)"),
    "overwrite_output_dir": ("same", "a fresh run into a directory with checkpoints is refused unless set"),
    "do_train": ("same", "read by scripts"),
    "do_eval": ("same", "read by scripts"),
    "do_predict": ("same", "read by scripts"),
    "do_export": ("same", "read by scripts"),
    "evaluation_strategy": ("default", "default epoch (PaddleNLP: no)"),
    "prediction_loss_only": ("unsupported", "evaluation always returns predictions; drop compute_metrics for loss only"),
    "per_device_train_batch_size": ("same", ""),
    "per_device_eval_batch_size": ("same", ""),
    "gradient_accumulation_steps": ("same", ""),
    "eval_accumulation_steps": ("ignored", "predictions stay on the device until the evaluation ends"),
    "learning_rate": ("same", ""),
    "weight_decay": ("same", "never applied to biases and norm weights"),
    "adam_beta1": ("same", ""),
    "adam_beta2": ("same", ""),
    "adam_epsilon": ("same", ""),
    "max_grad_norm": ("default", "default None = no clipping (PaddleNLP: 1.0); 0 also means no clipping"),
    "num_train_epochs": ("default", "default 3 (PaddleNLP: 1)"),
    "max_steps": ("same", ""),
    "lr_scheduler_type": ("same", "linear, cosine, constant (and step, multistep); polynomial is not supported"),
    "warmup_ratio": ("same", ""),
    "warmup_steps": ("same", ""),
    "num_cycles": ("unsupported", "cosine decays to 0 once"),
    "lr_end": ("unsupported", "polynomial decay is not supported"),
    "power": ("unsupported", "polynomial decay is not supported"),
    "log_on_each_node": ("ignored", "rank 0 logs"),
    "logging_dir": ("ignored", "logs go to output_dir (metrics.jsonl, visualdl/)"),
    "logging_strategy": ("same", ""),
    "logging_first_step": ("same", ""),
    "logging_steps": ("default", "default 10 (PaddleNLP: 500)"),
    "save_strategy": ("same", ""),
    "save_steps": ("same", ""),
    "save_total_limit": ("default", "default 3, the newest 3 of this run (PaddleNLP: None = keep all); the best checkpoint is always kept as well"),
    "save_on_each_node": ("ignored", "rank 0 writes checkpoints; use a shared output_dir on several nodes"),
    "no_cuda": ("same", "true means device cpu"),
    "seed": ("same", ""),
    "bf16": ("renamed", "amp bf16 (bf16 accepted too)"),
    "fp16": ("renamed", "amp fp16 (fp16 accepted too)"),
    "fp16_opt_level": ("renamed", "amp_level (fp16_opt_level accepted too)"),
    "amp_master_grad": ("unsupported", "O2 keeps fp32 master weights; master gradients are not separate"),
    "bf16_full_eval": ("unsupported", "evaluation runs under the training AMP setting"),
    "fp16_full_eval": ("unsupported", "evaluation runs under the training AMP setting"),
    "amp_custom_black_list": ("unsupported", "AMP uses paddle's default op lists"),
    "amp_custom_white_list": ("unsupported", "AMP uses paddle's default op lists"),
    "sharding": ("unsupported", _HYBRID),
    "sharding_degree": ("unsupported", _HYBRID),
    "sharding_parallel_degree": ("unsupported", _HYBRID),
    "save_sharded_model": ("unsupported", _HYBRID),
    "load_sharded_model": ("unsupported", _HYBRID),
    "tensor_parallel_degree": ("unsupported", _HYBRID),
    "pipeline_parallel_degree": ("unsupported", _HYBRID),
    "sep_parallel_degree": ("unsupported", _HYBRID),
    "data_parallel_config": ("unsupported", _HYBRID),
    "tensor_parallel_config": ("unsupported", _HYBRID),
    "pipeline_parallel_config": ("unsupported", _HYBRID),
    "sharding_parallel_config": ("unsupported", _HYBRID),
    "hybrid_parallel_topo_order": ("unsupported", _HYBRID),
    "recompute": ("unsupported", "use paddle.distributed.fleet.utils.recompute in the model's forward"),
    "scale_loss": ("unsupported", "the fp16 loss scaler starts at 2**15 (callbacks.AMP)"),
    "minimum_eval_times": ("unsupported", "set eval_steps"),
    "local_rank": ("same", "filled from the launcher's environment (PADDLE_RANK_IN_NODE), as in PaddleNLP"),
    "dataloader_drop_last": ("same", ""),
    "eval_steps": ("default", "default 0 = unset (PaddleNLP: None = logging_steps); set it with evaluation_strategy steps"),
    "max_evaluate_steps": ("unsupported", "evaluation covers the whole dataset; pass a smaller eval_dataset"),
    "dataloader_num_workers": ("same", ""),
    "past_index": ("unsupported", "no mems/past state between steps"),
    "run_name": ("ignored", "name the output_dir instead"),
    "device": ("default", "default auto, resolved to gpu or cpu (PaddleNLP: gpu)"),
    "disable_tqdm": ("same", ""),
    "remove_unused_columns": ("same", "drops sample keys the model's forward does not take (labels kept)"),
    "label_names": ("same", ""),
    "load_best_model_at_end": ("same", ""),
    "metric_for_best_model": ("same", "accuracy and eval_accuracy both work"),
    "greater_is_better": ("same", ""),
    "ignore_data_skip": ("unsupported", "resume is exact: the sampler jumps to its position, nothing is replayed"),
    "optim": ("same", "adamw (also momentum, sgd); other PaddleNLP optimizers are not supported"),
    "report_to": ("default", "tqdm, jsonl, visualdl, png; none, all (default tqdm, jsonl, visualdl; PaddleNLP: visualdl)"),
    "wandb_api_key": ("unsupported", "no wandb logger: write a callback that logs state.logs"),
    "resume_from_checkpoint": ("same", "a checkpoint directory of this project, auto or true"),
    "skip_memory_metrics": ("ignored", "no memory metrics in logs; callbacks.GPUUtilizationMonitor reports GPU memory"),
    "flatten_param_grads": ("unsupported", "NPU only"),
    "lazy_data_processing": ("ignored", "datasets are used as given"),
    "skip_profile_timer": ("ignored", "callbacks are timed always (trainer.describe_callbacks())"),
    "distributed_dataloader": ("unsupported", "every rank reads its own shard"),
    "unified_checkpoint": ("unsupported", _UC),
    "to_static": ("unsupported", _AUTO),
    "unified_checkpoint_config": ("unsupported", _UC),
    "ignore_load_lr_and_optim": ("unsupported", "a resume restores optimizer and scheduler: use a fresh run to reset them"),
    "ignore_save_lr_and_optim": ("unsupported", "checkpoints always hold optimizer and scheduler state"),
    "force_reshard_pp": ("unsupported", _HYBRID),
    "enable_auto_parallel": ("unsupported", _AUTO),
    "use_expert_parallel": ("unsupported", _HYBRID),
}

# the PaddleNLP name -> ours, for renamed fields carried by value
_RENAMED = {"fp16": "fp16", "bf16": "bf16", "fp16_opt_level": "fp16_opt_level"}


def convert_args(pargs: Any):
    """Our ``TrainingArguments`` from a paddlenlp one; warns once naming every set field that has no counterpart."""
    from ..args import TrainingArguments

    ours = set(TrainingArguments.field_names())
    values: dict = {}
    dropped = []
    reference = _reference(pargs)
    for f in dataclasses.fields(pargs):
        if not f.init:
            continue
        name, value = f.name, getattr(pargs, f.name)
        kind = FIELDS.get(name, ("unsupported", "not a PaddleNLP TrainingArguments field"))[0]
        if name == "local_rank":
            continue  # ours reads the launcher's environment itself
        if kind in ("same", "default", "renamed") and name in ours:
            values[name] = _plain(value)
        elif name in ours:  # a field without an effect here: carried when set (ours then names it in a warning)
            if _is_set(f, value, reference):
                values[name] = _plain(value)
        elif _is_set(f, value, reference):
            dropped.append(name)
    # PaddleNLP's device default is gpu even without one: gpu here means "the GPU when there is one"
    values["device"] = "cpu" if values.get("device") == "cpu" else "auto"
    report_to = values.get("report_to")
    if report_to is not None:
        from ..args import REPORTERS

        report_to = [report_to] if isinstance(report_to, str) else list(report_to)
        dropped += [f"report_to:{r}" for r in report_to if r not in REPORTERS + ("none", "all")]
        values["report_to"] = [r for r in report_to if r in REPORTERS + ("none", "all")] or ["none"]
    if values.get("eval_steps") is None:
        values["eval_steps"] = values.get("logging_steps", 0)  # PaddleNLP's rule for an unset eval_steps
    if values.get("report_to") is None:
        values["report_to"] = ["visualdl"]
    values["flush_at_end"] = False  # the last step is like any other, as in PaddleNLP
    if values.get("disable_tqdm") is None:
        values["disable_tqdm"] = False
    if dropped:
        logger.warning("these paddlenlp TrainingArguments have no counterpart here and are ignored: %s "
                       "(see docs/how-to/migrate-paddlenlp.md)", ", ".join(_describe(pargs, n) for n in dropped))
    return TrainingArguments(**values)


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
    try:
        return type(pargs)(output_dir=pargs.output_dir)
    except Exception:  # noqa: BLE001 - a subclass with other required fields: compare with the declared defaults
        return None


def _is_set(f: dataclasses.Field, value, reference) -> bool:
    """Whether ``value`` differs from the default (so dropping it changes the run)."""
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
