"""Restoring a trainer from a verified checkpoint: everything :func:`~trainer.checkpoint.snapshot.snapshot` took."""

from __future__ import annotations

import logging
from typing import Optional, Union

import paddle

from .. import distributed as dist
from ..errors import ConfigError, DataError
from ..layout.adapters import frozen_base, frozen_tensor_ids, set_state
from ..layout.slices import sliced_optimizer_state, split_parameters
from ..layout.stages import own_names
from .manifest import VerifiedCheckpoint, read_verified
from .resume import check_frozen_base, plan_world_size
from .rng import set_rng_state
from .snapshot import join_optimizer_state, param_name_map
from .store import resolve_read

logger = logging.getLogger("trainer.checkpoint")


def load_checkpoint(trainer, path: Union[str, VerifiedCheckpoint]) -> Optional[str]:
    """Restore everything :func:`snapshot` took. ``auto`` with no checkpoint is a no-op (returns None).

    ``path``: a checkpoint directory, ``auto``, or the :class:`VerifiedCheckpoint` resume has
    already read and verified (not read again). Every file is read and checked before anything
    is changed; state that still cannot be applied raises DataError, so no run trains on a
    half-restored state.
    """
    ckpt = path if isinstance(path, VerifiedCheckpoint) else resolve_read(path, trainer.args.output_dir)
    if ckpt is None:
        return None
    resolved, meta = ckpt.path, ckpt.meta
    put_model, opt_tensors = _model_part(trainer, ckpt)
    try:
        adapt_to_world_size(trainer, meta)
        put_model()
        names = param_name_map(trainer.model)
        opt_state = join_optimizer_state(opt_tensors, meta["optimizer_scalars"], names)
        trainer.resumed_optimizer_state = dict(opt_state)  # for a layout that slices parameters (reslice_optimizer)
        trainer.optimizer.set_state_dict(opt_state)
        if trainer.lr_scheduler is not None and meta["lr_scheduler"] is not None:
            trainer.lr_scheduler.set_state_dict(meta["lr_scheduler"])
        trainer.state.load_state_dict(meta["state"])
        unclaimed = trainer.callbacks.load_state_dict(meta["callbacks"])
        window = meta.get("loss_window")
        if window:  # every rank carries the ranks' mean: the logged mean over ranks comes out the same
            trainer._losses.reset(window["sum"], int(window["steps"]))
        if meta["world_size"] == dist.get_world_size():
            set_rng_state(meta["rng_per_rank"][dist.get_rank()])
        else:
            logger.warning("checkpoint %s was written by %d processes, this run has %d: the RNG states are not "
                           "restored", resolved, meta["world_size"], dist.get_world_size())
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - paddle's set_state_dict raises asserts and RuntimeErrors
        raise DataError(f"checkpoint {resolved} holds state this run cannot take ({type(exc).__name__}: {exc}): "
                        "it is damaged or from an incompatible version") from None
    if unclaimed and dist.is_main_process():
        logger.warning(
            "checkpoint %s holds state for callbacks that are not registered: %s", resolved, ", ".join(unclaimed))
    return resolved


def load_model_weights(trainer, path: str) -> str:
    """Put the model weights of the verified checkpoint ``path`` into ``trainer.model`` as this run lays it out
    (``load_best_model_at_end``): any layout that wrote it; an adapter's tensors into its inner model, a frozen
    base left out of a LoRA checkpoint kept as it is. The optimizer and the rest of the run are left alone."""
    ckpt = read_verified(path)
    put_model, _ = _model_part(trainer, ckpt)
    try:
        put_model()
    except Exception as exc:  # noqa: BLE001 - paddle's set_state_dict raises asserts and RuntimeErrors
        raise DataError(f"checkpoint {ckpt.path} holds weights this model cannot take ({type(exc).__name__}: "
                        f"{exc})") from None
    return ckpt.path


def _model_part(trainer, ckpt: VerifiedCheckpoint):
    """``(put_model, opt_tensors)``: the checkpoint's model tensors checked against this rank's part of the model
    (a mismatch is a DataError now), and a function that puts them in; this rank's optimizer tensors."""
    own = trainer.layout.whole_state(trainer.model)  # what this rank holds, under the whole model's names
    try:  # this rank's part of the whole model's tensors, whichever layout wrote them
        model_state, opt_tensors = trainer.layout.local_state(trainer.model, ckpt.model_state, ckpt.opt_tensors)
    except ValueError as exc:
        raise DataError(f"checkpoint {ckpt.path} cannot be split for this run: {exc}") from None
    kept = _check_model(trainer.model, own, model_state, ckpt)

    def put_model():
        # an adapter's tensors go to its inner model (its own set_state_dict would skip them: layout.adapters)
        set_state(trainer.model, own_names(trainer.model, {k: _as_tensor(v, own[k].dtype)
                                                           for k, v in model_state.items()}),
                  may_miss=set(own_names(trainer.model, dict.fromkeys(kept))))

    return put_model, opt_tensors


def _check_model(model, own: dict, model_state: dict, ckpt: VerifiedCheckpoint) -> set:
    """Check the checkpoint's model tensors against ``own`` (this model's, by name) and return the names it left
    out as a LoRA run's frozen base (``meta["frozen_base"]``: ``trainer.layout.adapters.frozen_base``): they keep
    the values the script loaded. Only this model's frozen parameters qualify; any other missing tensor, one too
    many or a shape that differs is a DataError."""
    frozen = frozen_tensor_ids(model) if ckpt.meta.get("frozen_base") else set()
    kept = {k for k, v in own.items() if k not in model_state and id(v) in frozen}
    missing = sorted(set(own) - set(model_state) - kept)
    unexpected = sorted(set(model_state) - set(own))
    mismatched = sorted(k for k in set(own) & set(model_state) if list(own[k].shape) != list(model_state[k].shape))
    if missing or unexpected or mismatched:
        detail = "; ".join(part for part in (
            f"missing {missing[:5]}" if missing else "", f"unexpected {unexpected[:5]}" if unexpected else "",
            f"shape differs for {mismatched[:5]}" if mismatched else "") if part)
        hint = ("; it holds a LoRA adapter: wrap the base model in the LoRAModel the run trained (its LoRAConfig) "
                "first" if any(".lora_" in k for k in unexpected) and not any(".lora_" in k for k in own) else "")
        raise DataError(f"checkpoint {ckpt.path} is for another model ({detail}): resume with the model that wrote "
                        f"it{hint}")
    return kept


def load_weights(model: paddle.nn.Layer, path: str) -> str:
    """Put a checkpoint's model weights, whole, into ``model`` (a bare layer); returns the checkpoint's path.

    Any format and layout: a sharded checkpoint's shards are verified and put together. What an export of a run
    whose parameters lived in slices (sharding stage 3) starts from, on one process::

        load_weights(model, "out/checkpoints/step-1000")
        Trainer(model, TrainingArguments(output_dir="out"), train_dataset=data).export()

    A LoRA run's checkpoint holds the adapter without its frozen base: ``model`` is the LoRA model built on the
    base the run started from (its weights loaded), and a base that differs is refused (ConfigError).
    """
    ckpt = read_verified(path)
    own = model.state_dict()
    kept = _check_model(model, own, ckpt.model_state, ckpt)  # a LoRA checkpoint: the base is the model's
    check_frozen_base(frozen_base(model), ckpt.meta, ckpt.path, doing="load_weights")
    set_state(model, {k: _as_tensor(v, own[k].dtype) for k, v in ckpt.model_state.items()}, may_miss=kept)
    return ckpt.path


def reslice_optimizer(trainer) -> None:
    """After the layout is applied: give a sharding stage 3 optimizer the resumed states of its sliced parameters
    as the ranges this rank holds (``trainer.layout.slices``); then let the whole states go."""
    state = getattr(trainer, "resumed_optimizer_state", None)
    trainer.resumed_optimizer_state = None
    if state is None:
        return
    split = split_parameters(trainer.model, trainer.layout.sharding_rank)
    if split:
        trainer.optimizer.set_state_dict(sliced_optimizer_state(split, state))


def adapt_to_world_size(trainer, meta: dict) -> None:
    """Resuming on another number of processes keeps the global batch through accumulation
    (``trainer.checkpoint.resume.plan_world_size``; fit() has applied it before planning the schedule)."""
    plan_world_size(trainer.args, meta, trainer.layout.data_world_size)  # ranks reading different data


def _as_tensor(array, dtype) -> paddle.Tensor:
    """One copy into a tensor; a cast only when the model keeps another dtype (bfloat16 is saved as float32)."""
    t = paddle.to_tensor(array)
    return t if t.dtype == dtype else t.astype(dtype)
