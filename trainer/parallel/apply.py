"""Apply a :class:`~trainer.layout.Layout` to the model and optimizer: the one place, in a fixed order.

``Trainer.fit`` calls :func:`parallelize` once, after ``on_fit_begin`` (AMP O2 has cast the
parameters then: gradient buckets and shards are built for the dtypes the parameters have):

1. recompute (``trainer.parallel.recompute``), on the bare model;
2. master gradients (``amp_master_grad``: paddle's ``mix_precision_utils``, float32 ``main_grad``);
3. tensor parallel, pipeline parallel, sharding or data parallel: tensor and pipeline parallel (alone or with
   data parallel and stage 1) and stage 1 through fleet's hybrid topology (:func:`init_topology`;
   ``fleet.distributed_model``: TensorParallel / PipelineParallel / ShardingParallel,
   ``fleet.distributed_optimizer``: HybridParallelOptimizer, DygraphShardingOptimizer inside), stages 2 and 3 through
   ``paddle.distributed.sharding.group_sharded_parallel`` (``os_g`` / ``p_g_os``, ``offload``) over
   fleet's sharding group (and its data-parallel group when dp > 1), otherwise ``paddle.DataParallel``, whose
   gradient average runs in the step's last backward or, when a PaddleNLP model recomputes through its own switch
   and under ``auto_find_batch_size``, after the step's backwards in one fused all-reduce
   (``Parallelized.grad_sync``: ``trainer.parallel.grad_sync``).

Gradient clipping under sharding, tensor and pipeline parallel runs inside paddle's optimizer step
(``ClipGradByGlobalNorm``, which paddle turns into a clip whose norm is reduced over the sharding group, and
under fleet's HybridParallelOptimizer over the model- and pipeline-parallel groups too): the layout says so
(``clips_in_optimizer``), ``trainer.optim.clipping`` gives the optimizer its clip or clips in the loop, and
:func:`parallelize` refuses an optimizer of the user's built without one.
Everything here is paddle's own engine; nothing is a home-made collective.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

import paddle
from paddle.distributed import fleet

from .. import distributed as dist
from ..errors import ConfigError, option
from ..layout import Layout
from ..layout.slices import tensor_parallel_splits
from .grad_sync import GradSync
from .pipeline import PipelineInference, PipelineSteps, require_pipeline_model
from .recompute import apply_recompute, switches_own_recompute

logger = logging.getLogger("trainer")

_LEVELS = {2: "os_g", 3: "p_g_os"}


@dataclass
class Parallelized:
    """What :func:`parallelize` returns: the model the loop runs, the optimizer and loss scaler it steps."""

    model: paddle.nn.Layer
    optimizer: Any
    scaler: Any = None
    inference_model: Optional[paddle.nn.Layer] = None  # what evaluation runs when not the bare model (stage 3's wrapper)
    # what runs one optimizer step's forwards and backwards, ``runner(trainer, next_batch) -> step loss`` (pipeline
    # parallel: paddle's schedule, trainer.parallel.pipeline); None: the loop's own accumulation
    step_runner: Optional[Callable] = None
    # when DataParallel averages the gradients: in the last backward, or after the step's backwards (grad_sync)
    grad_sync: Optional[GradSync] = None

    def __post_init__(self):
        if self.grad_sync is None:
            self.grad_sync = GradSync(self.model)  # no DataParallel: nothing to do


def parallelize(model: paddle.nn.Layer, optimizer, layout: Layout, args, scaler=None) -> Parallelized:
    """Apply ``layout`` (see the module docstring for the order); fills ``layout``'s groups. Every rank calls it."""
    # the model's own recompute may be reentrant (PaddleNLP's ERNIE), whose inner backward trips DataParallel's
    # reducer; auto_find_batch_size: the ranks agree before any all-reduce. Both defer the average (grad_sync)
    defer_sync = args.auto_find_batch_size or (layout.recompute and switches_own_recompute(model, args.recompute_modules))
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
        model = paddle.DataParallel(model, find_unused_parameters=args.find_unused_parameters)
        return Parallelized(model, optimizer, scaler, grad_sync=GradSync(model, deferred=bool(defer_sync)))
    if optimizer is None:
        raise ConfigError("sharding, tensor and pipeline parallel need the optimizer before the model is wrapped: "
                          "pass Trainer(optimizer=...) or let the trainer build it")
    _require_clip(layout, optimizer, args.max_grad_norm)
    configs = set(layout.sharding_options)
    init_topology(layout, args)  # up already, groups read, when the arguments brought it up for this layout
    logger.info("parallel layout: %s", layout.summary())
    if layout.sharding_stage <= 1:
        if layout.pp_degree > 1:
            require_pipeline_model(model, layout.pp_degree)
        unsplit = unsplit_model_warning(model, layout)
        if unsplit and layout.rank == 0:
            logger.warning(unsplit)
        # fleet's wrappers: TensorParallel / PipelineParallel / ShardingParallel / DataParallel by the topology, and
        # HybridParallelOptimizer (DygraphShardingOptimizer inside for stage 1), which clips by the norm over every group
        model = fleet.distributed_model(model)
        optimizer = fleet.distributed_optimizer(optimizer)
        scaler = fleet.distributed_scaler(scaler) if isinstance(scaler, paddle.amp.GradScaler) else scaler
        if layout.pp_degree > 1:  # paddle's schedule runs the step; evaluation goes through the stages
            return Parallelized(model, optimizer, scaler, inference_model=PipelineInference(model, layout.hcg),
                                step_runner=PipelineSteps(model))
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


def unsplit_model_warning(model: paddle.nn.Layer, layout: Layout) -> Optional[str]:
    """The one warning line for ``tensor_parallel_degree`` > 1 on a model that has no tensor-parallel layers (no
    parameter of fleet's ColumnParallelLinear, RowParallelLinear or VocabParallelEmbedding: nothing is split, each
    rank of a tensor-parallel group trains the whole model); None otherwise."""
    if layout.mp_degree == 1 or tensor_parallel_splits(model):
        return None
    return (f"{option('tensor_parallel_degree', layout.mp_degree)} but {type(model).__name__} has no tensor-parallel "
            "layers (fleet's ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding): nothing is split, every "
            f"rank of a tensor-parallel group trains the whole model; build the model from them "
            f"(docs/how-to/model-parallel.md) or set {option('tensor_parallel_degree', 1)}")


def agreeing_scaler(layout: Layout, scaler):
    """``scaler`` made to agree across ranks on skipping a step when the layout reduces gradients only inside the
    optimizer step (sharding) or its ranks hold different gradients (tensor and pipeline parallel): a loss scaler
    with ``agree_across_ranks`` (callbacks.loss_scaler) sums its non-finite flag over the ranks. Paddle's own
    GradScaler is wrapped by :func:`parallelize` instead."""
    if (layout.sharded or layout.splits_parameters) and hasattr(scaler, "agree_across_ranks"):
        scaler.agree_across_ranks = True
    return scaler


_hybrid_key: Optional[tuple] = None  # what fleet.init was last called with in this process (init_topology)


def hybrid_strategy(layout: Layout, accumulation: int = 1, seed: Optional[int] = None,
                    micro_batch_size: int = 1) -> "fleet.DistributedStrategy":
    """fleet's ``DistributedStrategy`` for ``layout``: the hybrid degrees and axis order, the sharding, tensor-parallel
    (``mp_configs``) and pipeline (``pp_configs``, ``pipeline_configs``) options, and the seed of the model-parallel
    RNG tracker (``tensor_init_seed``), as PaddleNLP's TrainingArguments builds them."""
    strategy = fleet.DistributedStrategy()
    hybrid = {"dp_degree": layout.dp_degree, "mp_degree": layout.mp_degree, "pp_degree": layout.pp_degree,
              "sharding_degree": layout.sharding_degree,
              # paddle 3.3's axes: segment (sep) and context (cp) parallel, degree 1 here, sit just outside mp
              "order": [axis for axis in layout.order if axis != "mp"] + ["sep", "cp", "mp"]}
    tensor, pipe = set(layout.tensor_options), set(layout.pipeline_options)
    if layout.mp_degree > 1:
        # every rank of a tensor-parallel group reads the same batch (layout.data_rank): fleet's per-step broadcast
        # of the inputs from the group's first rank would be a copy of what each rank has (and asserts a GPU)
        mp = {"need_broadcast_data": False}
        if "enable_mp_async_allreduce" in tensor:
            mp["mp_async_allreduce"] = True
            mp["mp_skip_c_identity"] = "enable_mp_skip_c_identity" in tensor
            mp["mp_fused_linear_param_grad_add"] = "enable_mp_fused_linear_param_grad_add" in tensor
        hybrid["mp_configs"] = mp
    if layout.pp_degree > 1:
        hybrid["pp_configs"] = {"delay_scale_loss": "enable_delay_scale_loss" in pipe,
                                "dp_comm_overlap": "enable_dp_comm_overlap" in pipe and layout.dp_degree > 1,
                                "sharding_comm_overlap": "enable_sharding_comm_overlap" in pipe and layout.sharding_degree > 1,
                                "enable_timer": "enable_timer" in pipe,
                                "release_gradients": "enable_release_grads" in pipe,
                                "overlap_p2p_comm": "enable_overlap_p2p_comm" in pipe,
                                "clear_every_step_cache": "enable_clear_every_step_cache" in pipe,
                                "use_batch_p2p_comm": "disable_batch_p2p_comm" not in pipe}
        strategy.pipeline_configs = {"accumulate_steps": accumulation, "micro_batch_size": micro_batch_size,
                                     "enable_partial_send_recv": "disable_partial_send_recv" not in pipe,
                                     # off whatever disable_p2p_cache_shape says: batches differ in shape (padding
                                     # per batch, evaluation's batch size, an epoch's last batch), so the stages send
                                     # every micro-batch's shapes (paddle's cache would receive into the first ones)
                                     "p2p_cache_shape": False}
    strategy.hybrid_configs = hybrid
    if layout.mp_degree > 1 and seed is not None:
        # fleet seeds the global generator with it and the model-parallel tracker with it + 1 + the rank's place;
        # paddle reads 0 as "draw one" (in each process: the ranks of a group would disagree), so 0 goes in as 2**31-1
        strategy.tensor_parallel_configs = {"tensor_init_seed": int(seed) or 2 ** 31 - 1}
    sharding, configs = strategy.hybrid_configs["sharding_configs"], set(layout.sharding_options)
    if "split_param" in configs:
        sharding.split_param = True
    if "enable_stage1_tensor_fusion" in configs:
        sharding.tensor_fusion = True
    if "enable_stage1_overlap" in configs:
        sharding.comm_overlap = True
        sharding.accumulate_steps = accumulation
    if "disable_stage1_reduce_avg" in configs:
        sharding.use_reduce_avg = False
    return strategy


def _in_gloo_rendezvous(exc: BaseException) -> bool:
    """Whether ``exc`` came out of paddle's gloo group rendezvous (``ProcessGroupGloo.create`` in
    ``_new_process_group_impl``): a CPU build of paddle 3.3 meets every group's ranks under the same store keys."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return any(f.name == "_new_process_group_impl" for f in frames) and "ProcessGroupGloo" in "".join(
        f.line or "" for f in frames)


def init_topology(layout: Layout, args) -> None:
    """Fleet's hybrid topology dp x sharding x mp x pp up for ``layout``, its groups on the layout: the one place
    ``fleet.init`` runs, once per process and layout (and the step settings fleet's strategy holds). Tensor- and
    pipeline-parallel models are built after it (fleet's parallel layers and ``PipelineLayer`` read its groups
    when they are constructed): :class:`trainer.TrainingArguments` calls it for the Layout it plans when
    ``tensor_parallel_degree`` or ``pipeline_parallel_degree`` is above 1, as PaddleNLP's does, and hands that
    Layout on to the trainer; :func:`parallelize` calls it for every hybrid layout, and finds the topology up
    and the groups on the layout when the arguments brought it up (it brings it up itself for sharding alone,
    or when a resume changed the accumulation steps since). Every rank calls it."""
    global _hybrid_key
    key = (tuple(sorted(layout.describe().items())), layout.order, layout.sharding_options, layout.tensor_options,
           layout.pipeline_options, args.gradient_accumulation_steps, args.seed, args.per_device_train_batch_size)
    if key == _hybrid_key and layout.hcg is not None:
        return  # up for this layout, whose groups were read when it was brought up
    if key != _hybrid_key:
        strategy = hybrid_strategy(layout, args.gradient_accumulation_steps, args.seed, args.per_device_train_batch_size)
        with dist.stderr_to_debug("trainer.distributed"):
            try:
                fleet.init(is_collective=True, strategy=strategy)
            except (RuntimeError, ValueError) as e:  # refused, reset, or a TIMEOUT of gloo's pair
                if _in_gloo_rendezvous(e):
                    raise RuntimeError(
                        "fleet.init: paddle's gloo rendezvous for the hybrid groups failed (a CPU build of paddle 3.3 "
                        "meets each group's ranks under store keys every group reuses, which a busy machine can race; "
                        "docs/how-to/large-models.md#on-a-cpu-build): nothing was trained or written; start the "
                        f"run again ({str(e).strip().splitlines()[-1]})") from e
                raise
        _hybrid_key = key
    dist.init_distributed()  # paddle's parallel env is up: the project's collectives use it as it is
    hcg = fleet.get_hybrid_communicate_group()
    layout.hcg = hcg
    layout.sharding_group = hcg.get_sharding_parallel_group()
    layout.dp_group = hcg.get_data_parallel_group()
    layout.mp_group = hcg.get_model_parallel_group()
    layout.pp_group = hcg.get_pipe_parallel_group()


def _require_clip(layout: Layout, optimizer, max_norm: Optional[float]) -> None:
    """Under sharding (or master gradients) clipping must be the optimizer's own: refuse an optimizer built without."""
    if not (max_norm and layout.clips_in_optimizer) or optimizer is None:
        return
    clip = getattr(optimizer, "_grad_clip", None)  # paddle keeps the constructor's grad_clip there (no public getter)
    if not isinstance(clip, paddle.nn.ClipGradByGlobalNorm):
        raise ConfigError(f"max_grad_norm={max_norm} with sharding, tensor or pipeline parallel (or amp_master_grad) "
                          "needs the optimizer to clip by the global norm: "
                          "build it with grad_clip=paddle.nn.ClipGradByGlobalNorm(max_grad_norm), or let the "
                          f"trainer build it, or set {option('max_grad_norm', None)}")
