"""What may change when a run resumes, and what is refused.

A resumed run must be the run that was interrupted, continued: the same
samples in the same order, the same optimizer, the same schedule. So before
anything is built, :func:`prepare_resume` reads the checkpoint's arguments
(``trainer.json``) and compares them with this run's:

- the fields in :data:`MAY_CHANGE` may change freely (they change what is
  logged, evaluated or saved, and where, not what is trained);
- the length of the run (``max_steps``, or ``num_train_epochs`` when
  ``max_steps`` is -1) may change, but never to fewer steps than the
  checkpoint has done; when it changes, the LR decay is planned over the new
  length from the resumed step on;
- the global batch (``per_device_train_batch_size`` x
  ``gradient_accumulation_steps`` x processes) must stay. On the same number
  of processes the per-device batch may change only together with the
  accumulation that keeps the global batch; on another number of processes
  the accumulation is set for you (:func:`plan_world_size`);
- the training dataset must have the same number of samples, and the same
  fingerprint when it gives one (:mod:`trainer.checkpoint.fingerprint`: an
  ImageFolder's files and sizes), unless ``resume_allow_data_change``;
- every other field (seed, data_seed, optim, learning_rate, the schedule, amp,
  ...) must be equal;
- a LoRA adapter (:func:`check_adapter`) must be built as the checkpoint records it (rank, alpha, scaling,
  dropout, targets);
- what else defines the run (``Trainer.run_identity``: for ``ptrain run``, the
  task and every task option) must be equal too, except the options the task
  lists in ``Task.resume_may_change`` with a reason; an option of the split
  (the identity's ``split`` names) can never be listed (:func:`check_identity`).

Anything else is refused with a :class:`ConfigError` of one line naming the
field, the checkpoint's value, this run's value and what to do. All of it runs
before the dataloader, optimizer and scheduler are built, so the schedule is
planned with the accumulation and length the resumed run really has.

    >>> sorted(MAY_CHANGE)[:3]
    ['dataloader_num_workers', 'device', 'disable_tqdm']
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Optional

from .. import distributed as dist
from ..data.iterable import is_iterable
from ..data.loader import dataset_length
from ..errors import ConfigError, DataError, option
from ..layout.adapters import describe as describe_adapter
from . import RESUME_ENV
from .fingerprint import checked, data_changes, data_fingerprint
from .manifest import VerifiedCheckpoint, check_meta
from .store import list_checkpoints, resolve_read

logger = logging.getLogger("trainer.resume")

#: Fields that may differ between the interrupted run and the resumed one: the one list (docs/how-to/resume.md).
MAY_CHANGE = frozenset({
    "output_dir", "resume_from_checkpoint", "resume_allow_data_change", "data_fingerprint",
    "logging_steps", "report_to", "disable_tqdm",
    "evaluation_strategy", "eval_steps", "per_device_eval_batch_size",
    "save_strategy", "save_steps", "save_total_limit", "save_async", "save_on_preemption",
    "metric_for_best_model", "greater_is_better",
    "dataloader_num_workers", "dataloader_read_ahead", "dataloader_persistent_workers", "device", "find_unused_parameters",
    "logging_strategy", "logging_first_step", "flush_at_end", "load_best_model_at_end", "overwrite_output_dir",
    "do_train", "do_eval", "do_predict", "do_export",
    "fp16", "bf16", "fp16_opt_level",  # PaddleNLP spellings: their effect is compared as amp / amp_level
    "auto_find_batch_size", "eval_accumulation_steps", "skip_memory_metrics",  # how, not what, is trained
    "logging_dir", "run_name", "wandb_api_key",  # where and how the trackers write (callbacks.tracking)
    # the layout: a checkpoint reshards onto any of them (trainer.checkpoint.shards); recompute gives equal gradients
    "sharding", "sharding_parallel_degree", "sharding_parallel_config", "recompute", "recompute_modules",
    "tensor_parallel_degree", "pipeline_parallel_degree", "tensor_parallel_config", "pipeline_parallel_config",
    "hybrid_parallel_topo_order",
})
#: Fields with their own rule (run length; global batch and world size), checked below.
LENGTH_FIELDS = ("max_steps", "num_train_epochs")
BATCH_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps")

_FRESH = "or start a fresh run in another output_dir"


def prepare_resume(trainer, resume: Optional[str]) -> Optional[VerifiedCheckpoint]:
    """Resolve ``resume`` (a path or ``auto``), check this run against the checkpoint and set the
    accumulation a new world size needs. Returns the checkpoint to load, already read and verified
    (the load applies it without reading it again), or None (fresh start)."""
    if not resume:
        return None
    ckpt = resolve_read(resume, trainer.args.output_dir)  # 'auto' says which checkpoint it picked and why
    if ckpt is None:
        return None
    path, meta = ckpt.path, ckpt.meta
    if resume != "auto" and dist.is_main_process():
        logger.info("resuming from %s (given explicitly; its files verify)", path)
    n = _dataset_len(trainer)
    readers = trainer.layout.data_world_size  # ranks reading different data: they fix the global batch
    plan_world_size(trainer.args, meta, readers)
    keep_adapted_accumulation(trainer.args, meta, readers)
    # recorded in the checkpoints this run writes (trainer.checkpoint.snapshot)
    trainer.accumulation_adapted = data_world_size(meta) != readers or bool(meta.get("accumulation_adapted"))
    check_identity(getattr(trainer, "run_identity", None) or {}, meta, path)
    check_adapter(trainer.model, meta, path)
    check_frozen_base(trainer.frozen_base, meta, path)
    check_resume(trainer.args, meta, n, readers, path)
    check_data(trainer.train_dataset, meta, path, trainer.args.resume_allow_data_change, trainer.args.data_fingerprint)
    _warn_uneven_epoch(meta, n, readers)
    return ckpt


def data_world_size(meta: dict) -> int:
    """How many ranks read different data in the run that wrote ``meta`` (dp x sharding; tensor- and pipeline-
    parallel ranks of one group read the same batch): what the global batch and the sampler depend on. A
    checkpoint of an older version records only its world size, which was that number."""
    readers = meta.get("data_world_size")
    return int(meta["world_size"] if readers is None else readers)


def check_data(dataset, meta: dict, path: str = "the checkpoint", allow_change: bool = False,
               mode: str = "sizes") -> None:
    """Refuse (ConfigError, one line) a training dataset whose fingerprint differs from the checkpoint's
    (:mod:`trainer.checkpoint.fingerprint`), unless ``allow_change`` (then a warning says what changed); when it
    matches, rank 0 says what was compared. The contents (``mode`` content) are hashed on rank 0 only."""
    old = meta.get("data_fingerprint")
    main = dist.is_main_process()
    new = data_fingerprint(dataset, mode if main else "sizes") if old else None
    what = None if new is None else data_changes(old, new)  # a dataset without the hook: its length was compared
    if what is None:
        if main:
            logger.info("%s", checked(dataset, old or {}, new, mode, meta.get("train_samples")))
        return
    if allow_change:
        if main:
            logger.warning("resume: the training data changed since checkpoint %s (%s); resuming anyway, as %s asks",
                           path, what, option("resume_allow_data_change", True))
        return
    raise ConfigError(f"resume: the training data changed since checkpoint {path} ({what}): the samples of every "
                      f"later step would not be the interrupted run's; resume with the data it had, resume anyway on "
                      f"purpose with {option('resume_allow_data_change', True)}, {_FRESH}")


def _warn_uneven_epoch(meta: dict, n: Optional[int], world_size: int) -> None:
    old_ws, state = data_world_size(meta), meta["state"]
    if n is None or old_ws == world_size or not state.get("step_in_epoch") or not (n % old_ws or n % world_size):
        return
    if dist.is_main_process():
        logger.warning("resume: %d samples do not divide by both %d and %d processes, so the epoch is padded "
                       "differently and the rest of epoch %d follows another order (some samples of it may be seen "
                       "twice or not at all); later epochs are complete again. Resume mid-epoch on %d processes, or at "
                       "an epoch boundary, to avoid it", n, old_ws, world_size, int(state.get("epoch", 0)), old_ws)


def resume_after_restart(requested: Optional[str], output_dir: str) -> Optional[str]:
    """What ``Trainer.fit`` resumes from: ``requested`` (its argument or ``resume_from_checkpoint``), except in a
    restarted job (``PTRAIN_RESUME=auto``) whose output_dir holds checkpoints: then ``"auto"``, the newest complete
    one, so that a restart goes on from where the job was and never back to the checkpoint it started from."""
    if os.environ.get(RESUME_ENV) != "auto":
        return requested
    return "auto" if list_checkpoints(output_dir) else requested


def read_meta(path: str) -> dict:
    try:
        with open(os.path.join(path, "trainer.json"), encoding="utf-8") as f:
            meta = json.load(f)
        check_meta(meta)
    except Exception as exc:  # noqa: BLE001 - any defect of the file is a damaged checkpoint
        raise DataError(f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc}): it is damaged or "
                        "from an incompatible version") from None
    return meta


def _dataset_len(trainer) -> Optional[int]:
    """The training set's sample count; None for an IterableDataset (a stream has no length to compare)."""
    if is_iterable(trainer.train_dataset):
        return None
    return dataset_length(trainer.train_dataset, "training")


def plan_world_size(args, meta: dict, world_size: int) -> None:
    """Another number of processes: keep the checkpoint's global batch through ``gradient_accumulation_steps``
    (set on ``args``), or refuse with choices that work. The same number: nothing to do here."""
    old_ws = data_world_size(meta)
    if old_ws == world_size:
        return
    saved = meta["args"]
    old_global = int(saved["per_device_train_batch_size"]) * int(saved["gradient_accumulation_steps"]) * old_ws
    batch = args.per_device_train_batch_size
    per_step = batch * world_size
    if old_global % per_step:
        sizes = [b for b in range(1, old_global + 1) if old_global % (b * world_size) == 0]
        procs = [p for p in range(1, old_global + 1) if old_global % (batch * p) == 0]
        choices = []
        if sizes:
            choices.append(f"per_device_train_batch_size in {sizes[-6:]} on {world_size} processes")
        if procs:
            choices.append(f"{' or '.join(map(str, procs[-4:]))} process{'es' if procs[-1] > 1 else ''} with "
                           f"per_device_train_batch_size {batch}")
        choices.append(f"{old_ws} processes as before")
        raise ConfigError(
            f"checkpoint was written by {old_ws} processes with a global batch of {old_global}; {world_size} processes "
            f"x per_device_train_batch_size {batch} cannot reach it by accumulation: use "
            + "; or ".join(choices))
    accumulation = old_global // per_step
    if accumulation != args.gradient_accumulation_steps and dist.is_main_process():
        logger.warning("resuming a %d-process checkpoint on %d processes: gradient_accumulation_steps %d -> %d keeps "
                       "the global batch at %d", old_ws, world_size, args.gradient_accumulation_steps,
                       accumulation, old_global)
    args.gradient_accumulation_steps = accumulation


def keep_adapted_accumulation(args, meta: dict, world_size: int) -> None:
    """A checkpoint whose accumulation was set for its world size (an earlier resume on another number of
    processes) keeps it when resumed again on that number with the same per-device batch: a relaunch with the
    job's original flags is the same run, not a changed one."""
    saved = meta["args"]
    if (meta.get("accumulation_adapted") and data_world_size(meta) == world_size
            and args.per_device_train_batch_size == saved["per_device_train_batch_size"]
            and args.gradient_accumulation_steps != saved["gradient_accumulation_steps"]):
        if dist.is_main_process():
            logger.info("resume: gradient_accumulation_steps %d -> %d, as set for %d processes when this run moved "
                        "to them", args.gradient_accumulation_steps, saved["gradient_accumulation_steps"], world_size)
        args.gradient_accumulation_steps = int(saved["gradient_accumulation_steps"])


def check_resume(args, meta: dict, dataset_len: Optional[int], world_size: int, path: str = "the checkpoint") -> None:
    """Refuse (ConfigError, one line) what would make the resumed run differ from the interrupted one."""
    saved, state = meta["args"], meta["state"]
    where = f"checkpoint {path}"
    now = args.to_dict()
    free = MAY_CHANGE | set(args.no_effect_fields()) | {"local_rank", "no_cuda"}  # PaddleNLP's fields: no effect here
    # 1. plain fields: equal, unless listed as free to change
    for name in sorted(now):
        if name in free or name in LENGTH_FIELDS or name in BATCH_FIELDS or name not in saved:
            continue
        old, new = saved[name], now[name]
        if _same(old, new):
            continue
        raise ConfigError(f"resume: {name} was {old!r} in {where}, this run has {new!r}: it would change what is "
                          f"trained; resume with {option(name, old)}, {_FRESH}")
    # 2. the global batch on the same number of processes
    if data_world_size(meta) == world_size:
        old_b, old_k = int(saved["per_device_train_batch_size"]), int(saved["gradient_accumulation_steps"])
        new_b, new_k = args.per_device_train_batch_size, args.gradient_accumulation_steps
        if old_b * old_k != new_b * new_k:
            old_global, new_global = old_b * old_k * world_size, new_b * new_k * world_size
            if new_b != old_b:
                keep = (", or keep the global batch with " + option("gradient_accumulation_steps", old_b * old_k // new_b)
                        if (old_b * old_k) % new_b == 0 else "")
                raise ConfigError(
                    f"resume: per_device_train_batch_size was {old_b} in {where}, this run has {new_b}: the global "
                    f"batch would be {new_global}, not {old_global}, and samples of the epoch would be replayed or "
                    f"skipped; resume with {option('per_device_train_batch_size', old_b)}{keep}, {_FRESH}")
            raise ConfigError(
                f"resume: gradient_accumulation_steps was {old_k} in {where}, this run has {new_k}: the global batch "
                f"would be {new_global}, not {old_global}, and samples of the epoch would be replayed or skipped; "
                f"resume with {option('gradient_accumulation_steps', old_k)}, {_FRESH}")
    # 3. the dataset
    old_n = meta.get("train_samples")
    if old_n is not None and dataset_len is not None and int(old_n) != dataset_len:
        raise ConfigError(
            f"resume: the training dataset has {dataset_len} samples, the run in {where} had {old_n}: the epoch's "
            f"order and length would change; resume with the same dataset, {_FRESH}")
    # 4. the length of the run: never below the checkpoint's step
    step = int(state.get("global_step", 0))
    if dataset_len is None:  # a stream (IterableDataset) has no epochs: its run length is max_steps
        steps_per_epoch = None
        planned = args.max_steps
    else:
        steps_per_epoch = _steps_per_epoch(args, dataset_len, world_size)
        planned = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * steps_per_epoch)
    if old_n is None and steps_per_epoch is not None and data_world_size(meta) == world_size and state.get("steps_per_epoch") not in (None, steps_per_epoch):
        raise ConfigError(
            f"resume: an epoch has {steps_per_epoch} steps in this run but had {state['steps_per_epoch']} in {where} "
            f"(another dataset size?): resume with the same dataset and batch, {_FRESH}")
    if planned < step:
        field = f"max_steps={args.max_steps}" if args.max_steps > 0 else \
            f"num_train_epochs={args.num_train_epochs:g} ({planned} steps)"
        raise ConfigError(f"resume: {field} is below step {step} of {where}, so there is nothing to train: give "
                          f"max_steps above {step} (or more num_train_epochs), or resume from an earlier checkpoint")
    old_planned = int(state.get("max_steps", planned) or planned)
    if planned != old_planned and dist.is_main_process():
        logger.warning("resume: this run trains to step %d, the checkpoint's run to step %d; the learning-rate decay "
                       "is planned over %d steps from step %d on", planned, old_planned, planned, step)


def check_identity(identity: dict, meta: dict, path: str = "the checkpoint") -> None:
    """Refuse (ConfigError, one line) a change of what defines the run besides TrainingArguments: the fields
    of ``Trainer.run_identity`` (``ptrain run``: the task and its options, see ``trainer.task.Task.run_identity``)
    against the ones the checkpoint recorded, except the fields its ``may_change`` lists (with the reason)."""
    saved = meta.get("identity") or {}
    old_fields, new_fields = saved.get("fields") or {}, identity.get("fields") or {}
    if not (isinstance(old_fields, dict) and old_fields and new_fields):
        return  # a checkpoint written before identities were recorded, or a run that records none
    allowed = {k: v for k, v in dict(identity.get("may_change") or {}).items() if k not in (identity.get("split") or ())}
    source = identity.get("source") or saved.get("source") or "the run"
    for name in sorted(set(old_fields) | set(new_fields)):
        if name in allowed:
            continue
        if name not in old_fields:  # an option newer than the checkpoint (e.g. max_image_pixels): it had none
            logger.debug("resume: %s (%s) is not recorded in checkpoint %s (written before it existed)", name,
                         source, path)
            continue
        old, new = old_fields.get(name), new_fields.get(name)
        if _same(old, new):
            continue
        what = ("which samples are train, eval and test (test data would leak into training)"
                if name in (identity.get("split") or ()) else "what is trained")
        raise ConfigError(f"resume: {name} ({source}) was {old!r} in checkpoint {path}, this run has {new!r}: it "
                          f"would change {what}; resume with {option(name, old)}, {_FRESH}")


#: what defines a LoRA adapter's training (trainer.layout.adapters.describe): a change is refused on resume
ADAPTER_FIELDS = ("r", "lora_alpha", "scaling", "lora_dropout", "rslora", "target_modules", "adapted_layers")


def check_frozen_base(base: Optional[dict], meta: dict, path: str = "the checkpoint", doing: str = "resume") -> None:
    """Refuse (ConfigError, one line) to put a checkpoint that holds a LoRA adapter without its frozen base onto
    another base: other tensors (names, shapes, dtypes) or other values (its digest of sampled values,
    ``trainer.layout.adapters.frozen_base``). ``doing``: what the message names (``resume``, ``load_weights``).
    A checkpoint that holds every tensor has nothing to check."""
    saved = meta.get("frozen_base")
    if not saved or base is None:  # every tensor saved; or a model without an adapter (check_adapter refuses it)
        return
    if base["names"] != saved["names"]:
        raise ConfigError(f"{doing}: checkpoint {path} holds the LoRA adapter without its frozen base, which had "
                          f"{saved['tensors']} tensors of {saved['elements']:,} values; this model's base has "
                          f"{base['tensors']} of {base['elements']:,} (or other names, shapes or dtypes): build "
                          "the model from the base model the run started from")
    if base["values"] != saved["values"]:
        raise ConfigError(f"{doing}: the frozen base model's weights differ from those checkpoint {path} was "
                          "trained on (the checkpoint holds the LoRA adapter only): load the base model the run "
                          f"started from (the same from_pretrained weights) before {doing}")


def check_adapter(model, meta: dict, path: str = "the checkpoint") -> None:
    """Refuse (ConfigError, one line) a LoRA adapter built otherwise than the one the checkpoint recorded (its
    alpha, scaling and dropout leave the tensors' names and shapes as they were, so nothing else would see it)."""
    if "adapter" not in meta:
        return  # written before checkpoints recorded adapters
    old, new = meta["adapter"], describe_adapter(model)
    if (old is None) != (new is None):
        raise ConfigError(f"resume: checkpoint {path} was written by a model {'without' if old is None else 'with'} a "
                          f"LoRA adapter, this run's model {'has one' if old is None else 'has none'}: build the "
                          f"model as the run that wrote it did, {_FRESH}")
    for name in ADAPTER_FIELDS if old is not None else ():
        if name in old and not _same(old[name], new.get(name)):
            raise ConfigError(f"resume: the LoRA adapter's {name} was {old[name]!r} in checkpoint {path}, this run's "
                              f"model has {new.get(name)!r}: it would change what is trained; build the adapter with "
                              f"{name}={old[name]!r}, {_FRESH}")


def _steps_per_epoch(args, dataset_len: int, world_size: int) -> int:
    per_rank = math.ceil(dataset_len / world_size)
    b = args.per_device_train_batch_size
    batches = per_rank // b if args.dataloader_drop_last else math.ceil(per_rank / b)
    return max(1, math.ceil(batches / args.gradient_accumulation_steps))


def _same(old, new) -> bool:
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        return list(old) == list(new)
    if isinstance(old, (int, float)) and isinstance(new, (int, float)) and not isinstance(old, bool) \
            and not isinstance(new, bool):
        return math.isclose(old, new, rel_tol=1e-12, abs_tol=0.0) or old == new
    return old == new
