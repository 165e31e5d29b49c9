"""Apply a :class:`~trainer.parallel.layout.Layout` to the model and optimizer: the one place, in a fixed order.

``Trainer.fit`` calls :func:`parallelize` once, after ``on_fit_begin`` (AMP O2 has cast the
parameters then: gradient buckets and shards are built for the dtypes the parameters have):

1. recompute (``trainer.parallel.recompute``), on the bare model;
2. master gradients (``amp_master_grad``: paddle's ``mix_precision_utils``, float32 ``main_grad``);
3. sharding or data parallel: stage 1 through fleet's hybrid topology (``fleet.distributed_model`` /
   ``fleet.distributed_optimizer``: DygraphShardingOptimizer), stages 2 and 3 through
   ``paddle.distributed.sharding.group_sharded_parallel`` (``os_g`` / ``p_g_os``, ``offload``) over
   fleet's sharding group (and its data-parallel group when dp > 1), otherwise ``paddle.DataParallel``.

Gradient clipping under sharding runs inside paddle's optimizer step (``ClipGradByGlobalNorm``, which
paddle turns into a clip whose norm is reduced over the sharding group): :func:`optimizer_grad_clip`
gives the optimizer the trainer builds its clip, :func:`clip_before_step` is the loop's clip.
Everything here is paddle's own engine; nothing is a home-made collective.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import paddle
from paddle.distributed import fleet

from .. import distributed as dist
from ..clipping import clip_grad_norm
from ..errors import ConfigError, option
from .layout import Layout
from .recompute import apply_recompute

logger = logging.getLogger("trainer")

_LEVELS = {2: "os_g", 3: "p_g_os"}


@dataclass
class Parallelized:
    """What :func:`parallelize` returns: the model the loop runs, the optimizer and loss scaler it steps."""

    model: paddle.nn.Layer
    optimizer: Any
    scaler: Any = None
    inference_model: Optional[paddle.nn.Layer] = None  # what evaluation runs when not the bare model (stage 3's wrapper)


def optimizer_grad_clip(layout: Layout, max_norm: Optional[float]):
    """The ``grad_clip`` an optimizer must be built with: paddle's ``ClipGradByGlobalNorm`` when the layout
    clips inside the optimizer step (``layout.clips_in_optimizer``) and clipping is on, else None."""
    if layout.clips_in_optimizer and max_norm:
        return paddle.nn.ClipGradByGlobalNorm(clip_norm=float(max_norm))
    return None


def clip_before_step(layout: Layout, parameters: Iterable[paddle.Tensor], max_norm: float,
                     clip=clip_grad_norm) -> Optional[paddle.Tensor]:
    """The loop's clip: by the global norm here with ``clip`` (the run's recipe: ours or PaddleNLP's arithmetic;
    returned as a device tensor), or None when paddle's optimizer clips inside its step (sharding: the gradients
    are reduced, and split, only there)."""
    if layout.clips_in_optimizer:
        return None
    return clip(parameters, max_norm)


def parallelize(model: paddle.nn.Layer, optimizer, layout: Layout, args, scaler=None) -> Parallelized:
    """Apply ``layout`` (see the module docstring for the order); fills ``layout``'s groups. Every rank calls it."""
    if layout.recompute:
        count = apply_recompute(model, args.recompute_modules)
        logger.debug("recompute: %d blocks of %s", count, type(model).__name__)
    if layout.master_grad:
        _require_clip(layout, optimizer, args.max_grad_norm)
        # float32 gradients (param.main_grad) for low-precision weights: paddle's mix_precision_utils
        from paddle.distributed.fleet.utils import mix_precision_utils

        mix_precision_utils.MixPrecisionLayer(model, dtype="bfloat16" if args.amp == "bf16" else "float16")
        optimizer = mix_precision_utils.MixPrecisionOptimizer(optimizer)
    if layout.world_size == 1:
        return Parallelized(model, optimizer, scaler)
    if not layout.uses_hybrid_topology:
        dist.init_distributed()
        logger.info("parallel layout: %s", layout.summary())
        return Parallelized(paddle.DataParallel(model, find_unused_parameters=args.find_unused_parameters),
                            optimizer, scaler)
    if optimizer is None:
        raise ConfigError("sharding needs the optimizer before the model is wrapped: pass Trainer(optimizer=...) "
                          "or let the trainer build it")
    _require_clip(layout, optimizer, args.max_grad_norm)
    configs = set(layout.sharding_options)
    _init_hybrid(layout, configs, args.gradient_accumulation_steps)
    logger.info("parallel layout: %s", layout.summary())
    if layout.sharding_stage == 1:
        model = fleet.distributed_model(model)
        optimizer = fleet.distributed_optimizer(optimizer)
        scaler = fleet.distributed_scaler(scaler) if isinstance(scaler, paddle.amp.GradScaler) else scaler
        return Parallelized(model, optimizer, scaler)
    from paddle.distributed.sharding import group_sharded_parallel

    model, optimizer, scaler = group_sharded_parallel(
        model, optimizer, _LEVELS[layout.sharding_stage], scaler=scaler, group=layout.sharding_group,
        offload=layout.offload, dp_group=layout.dp_group if layout.dp_degree > 1 else None)
    if "enable_stage2_overlap" in configs:  # as PaddleNLP's Trainer does
        model._set_reduce_overlap(True)
        optimizer._set_broadcast_overlap(True, model)
    # stage 3 keeps each rank's slice only: a forward must go through the wrapper, which gathers the parameters
    return Parallelized(model, optimizer, scaler, inference_model=model if layout.shards_parameters else None)


def agreeing_scaler(layout: Layout, scaler):
    """``scaler`` made to agree across ranks on skipping a step when the layout reduces gradients only inside the
    optimizer step (sharding): a loss scaler with ``agree_across_ranks`` (callbacks.loss_scaler) sums its
    non-finite flag over the ranks. Paddle's own GradScaler is wrapped by :func:`parallelize` instead."""
    if layout.sharded and hasattr(scaler, "agree_across_ranks"):
        scaler.agree_across_ranks = True
    return scaler


def _init_hybrid(layout: Layout, configs: set, accumulation: int) -> None:
    """``fleet.init`` over the hybrid topology dp x sharding (x mp x pp); fills the layout's groups."""
    strategy = fleet.DistributedStrategy()
    hybrid = {"dp_degree": layout.dp_degree, "mp_degree": layout.mp_degree, "pp_degree": layout.pp_degree,
              "sharding_degree": layout.sharding_degree}
    strategy.hybrid_configs = hybrid
    sharding = strategy.hybrid_configs["sharding_configs"]
    if "split_param" in configs:
        sharding.split_param = True
    if "enable_stage1_tensor_fusion" in configs:
        sharding.tensor_fusion = True
    if "enable_stage1_overlap" in configs:
        sharding.comm_overlap = True
        sharding.accumulate_steps = accumulation
    if "disable_stage1_reduce_avg" in configs:
        sharding.use_reduce_avg = False
    with dist.stderr_to_debug("trainer.distributed"):
        fleet.init(is_collective=True, strategy=strategy)
    dist.init_distributed()  # paddle's parallel env is up: the project's collectives use it as it is
    hcg = fleet.get_hybrid_communicate_group()
    layout.hcg = hcg
    layout.sharding_group = hcg.get_sharding_parallel_group()
    layout.dp_group = hcg.get_data_parallel_group()


def _require_clip(layout: Layout, optimizer, max_norm: Optional[float]) -> None:
    """Under sharding (or master gradients) clipping must be the optimizer's own: refuse an optimizer built without."""
    if not (max_norm and layout.clips_in_optimizer) or optimizer is None:
        return
    clip = getattr(optimizer, "_grad_clip", None)  # paddle keeps the constructor's grad_clip there (no public getter)
    if not isinstance(clip, paddle.nn.ClipGradByGlobalNorm):
        raise ConfigError(f"max_grad_norm={max_norm} with sharding needs the optimizer to clip by the global norm: "
                          "build it with grad_clip=paddle.nn.ClipGradByGlobalNorm(max_grad_norm), or let the "
                          f"trainer build it, or set {option('max_grad_norm', None)}")
