"""The model's layout over ranks: one small object that answers "which group reduces this?".

:class:`Layout` is planned from the arguments and the world size before anything runs
(:meth:`Layout.plan`: the one place the parallel fields are checked against each other), once per run:
``TrainingArguments`` plan it where they check their fields (``args.layout``) and the ``Trainer`` takes that one.
It gets its communication groups when fleet's topology is brought up for it (``trainer.parallel.apply.init_topology``:
from the arguments for tensor and pipeline parallel, else when :func:`trainer.parallel.parallelize` applies it).
The loop, the callbacks (NaN guard, logger), metrics and checkpoints read it as ``trainer.layout`` and never
branch on the parallel mode themselves; checkpoints and export ask it for the model's state as this rank holds
it (:meth:`Layout.local_state`, :meth:`Layout.whole_state`, :meth:`Layout.saved_blocks`,
:meth:`Layout.whole_model`), which on one process is the state as it is.

Ranks follow fleet's hybrid topology order, outermost first: ``dp, pp, sharding, mp``
(``hybrid_parallel_topo_order="pp_first"``, the default, as in PaddleNLP) or ``dp, sharding, pp, mp``
(``"sharding_first"``); ``mp`` is innermost, so the ranks of one tensor-parallel group are consecutive,
and with tensor and pipeline parallel off a rank is ``dp_rank * sharding_degree + sharding_rank``.
Ranks of one tensor- or pipeline-parallel group read the same batch: :attr:`Layout.data_rank` and
:attr:`Layout.data_world_size` say which slice of it a rank reads (dp x sharding slices).

Example::

    >>> layout = Layout.plan(world_size=4, sharding="stage2", sharding_parallel_degree=2)
    >>> layout.describe()["dp_degree"], layout.sharding_stage, layout.shards_gradients
    (2, 2, True)
    >>> Layout.plan(world_size=1).describe()
    {'world_size': 1, 'dp_degree': 1, 'sharding_degree': 1, 'sharding_stage': 0, 'offload': False, 'mp_degree': 1, 'pp_degree': 1}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import ConfigError, option

STAGES = ("stage1", "stage2", "stage3")
#: PaddleNLP's ``sharding_parallel_config`` words that act here (trainer.parallel.apply)
SHARDING_CONFIGS = ("enable_stage1_tensor_fusion", "enable_stage1_overlap", "enable_stage2_overlap", "split_param",
                    "disable_stage1_reduce_avg")
#: PaddleNLP's sharding words that are not stages
SHARDING_FLAGS = ("offload",)
#: PaddleNLP's ``tensor_parallel_config`` words (trainer.parallel.apply: fleet's ``mp_configs``)
TENSOR_CONFIGS = ("enable_mp_async_allreduce", "enable_mp_skip_c_identity", "enable_mp_fused_linear_param_grad_add",
                  "enable_delay_scale_loss")
#: PaddleNLP's ``pipeline_parallel_config`` words (trainer.parallel.apply: fleet's ``pp_configs``)
PIPELINE_CONFIGS = ("disable_p2p_cache_shape", "disable_partial_send_recv", "enable_delay_scale_loss",
                    "enable_dp_comm_overlap", "enable_sharding_comm_overlap", "enable_timer", "enable_release_grads",
                    "enable_clear_every_step_cache", "enable_overlap_p2p_comm", "disable_batch_p2p_comm")
#: ``hybrid_parallel_topo_order`` -> fleet's order of the hybrid axes, outermost first
TOPO_ORDERS = {"pp_first": ("dp", "pp", "sharding", "mp"), "sharding_first": ("dp", "sharding", "pp", "mp")}


def parse_sharding(value) -> tuple:
    """PaddleNLP's ``sharding`` string (``"stage2 offload"``, ``"stage1"``, ``""``) or list -> (stage, offload).

    >>> parse_sharding("stage2 offload"), parse_sharding(""), parse_sharding(["stage3"])
    ((2, True), (0, False), (3, False))
    """
    words = value if isinstance(value, (list, tuple)) else str(value or "").replace(",", " ").split()
    words = [str(w).strip().lower() for w in words if str(w).strip()]
    unknown = [w for w in words if w not in STAGES + SHARDING_FLAGS]
    if unknown:
        raise ConfigError(f"sharding={value!r} is not allowed: use stage1, stage2 or stage3, optionally with "
                          f"offload (e.g. {option('sharding', 'stage2 offload')})")
    stages = sorted({int(w[-1]) for w in words if w in STAGES})
    if len(stages) > 1:
        raise ConfigError(f"sharding={value!r} names {len(stages)} stages: choose one of stage1, stage2, stage3")
    offload = "offload" in words
    if offload and not stages:
        raise ConfigError(f"sharding={value!r}: offload needs a stage, e.g. {option('sharding', 'stage2 offload')}")
    return (stages[0] if stages else 0), offload


def sharding_configs(text: str, stage: int) -> tuple:
    """PaddleNLP's space-separated ``sharding_parallel_config`` -> its words; a ConfigError naming the field otherwise.

    >>> sharding_configs("split_param enable_stage1_tensor_fusion", 1)
    ('enable_stage1_tensor_fusion', 'split_param')
    """
    words = {w for w in str(text or "").replace(",", " ").split() if w}
    unknown = sorted(words - set(SHARDING_CONFIGS))
    if unknown:
        raise ConfigError(f"sharding_parallel_config={text!r}: {', '.join(unknown)} is not known: use any of "
                          f"{', '.join(SHARDING_CONFIGS)}")
    for word in sorted(words):
        wanted = 2 if word == "enable_stage2_overlap" else 1
        if stage and stage != wanted:
            raise ConfigError(f"sharding_parallel_config={text!r}: {word} is for sharding stage{wanted}, "
                              f"not stage{stage}: drop it or set {option('sharding', f'stage{wanted}')}")
    return tuple(sorted(words))


def config_words(name: str, text, known: tuple) -> tuple:
    """A space- (or comma-) separated PaddleNLP ``*_parallel_config`` -> its sorted words; unknown words are refused
    with one line naming the field.

    >>> config_words("tensor_parallel_config", "enable_mp_async_allreduce", TENSOR_CONFIGS)
    ('enable_mp_async_allreduce',)
    """
    words = {w for w in str(text or "").replace(",", " ").split() if w}
    unknown = sorted(words - set(known))
    if unknown:
        raise ConfigError(f"{name}={text!r}: {', '.join(unknown)} is not known: use any of {', '.join(known)}")
    return tuple(sorted(words))


def topo_order(value) -> tuple:
    """``hybrid_parallel_topo_order`` (None: PaddleNLP's default ``pp_first``) -> fleet's axis order.

    >>> topo_order(None), topo_order("sharding_first")
    (('dp', 'pp', 'sharding', 'mp'), ('dp', 'sharding', 'pp', 'mp'))
    """
    key = str(value or "pp_first")
    if key not in TOPO_ORDERS:
        raise ConfigError(f"hybrid_parallel_topo_order={value!r} is not known: use pp_first or sharding_first")
    return TOPO_ORDERS[key]


def _degree(name: str, value) -> Optional[int]:
    """A ``*_degree`` field: -1 (PaddleNLP's default, "decide for me") -> None; 0 or < -1 is refused."""
    value = int(value)
    if value == -1:
        return None
    if value < 1:
        raise ConfigError(f"{name}={value} is not allowed: {name} must be -1 (automatic) or an integer >= 1")
    return value


@dataclass
class Layout:
    """How the model is laid out over the ranks of this job.

    Degrees multiply to the world size: ``dp_degree * sharding_degree * mp_degree * pp_degree``.
    ``sharding_stage`` 0 is no sharding; 1 shards optimizer states (fleet's
    DygraphShardingOptimizer), 2 also gradients, 3 also parameters (paddle's
    ``group_sharded_parallel``). Groups are None until fleet's topology is brought up for
    the layout (``trainer.parallel.apply.init_topology``), and stay None for a degree of 1;
    a None group means "all ranks" to ``paddle.distributed`` collectives.
    """

    world_size: int = 1
    rank: int = 0
    dp_degree: int = 1
    sharding_degree: int = 1
    sharding_stage: int = 0
    offload: bool = False
    mp_degree: int = 1          # tensor parallel (fleet: TensorParallel)
    pp_degree: int = 1          # pipeline parallel (fleet: PipelineParallel)
    recompute: bool = False
    master_grad: bool = False   # amp_master_grad: float32 gradients (param.main_grad) beside low-precision weights
    sharding_options: tuple = ()  # sharding_parallel_config's words (SHARDING_CONFIGS)
    tensor_options: tuple = ()    # tensor_parallel_config's words (TENSOR_CONFIGS)
    pipeline_options: tuple = ()  # pipeline_parallel_config's words (PIPELINE_CONFIGS)
    order: tuple = TOPO_ORDERS["pp_first"]  # fleet's hybrid axis order, outermost first (hybrid_parallel_topo_order)
    # set when applied (paddle Group objects; fleet's HybridCommunicateGroup when the hybrid topology is used)
    dp_group: Any = field(default=None, repr=False, compare=False)
    sharding_group: Any = field(default=None, repr=False, compare=False)
    mp_group: Any = field(default=None, repr=False, compare=False)
    pp_group: Any = field(default=None, repr=False, compare=False)
    hcg: Any = field(default=None, repr=False, compare=False)

    # ---- planning: the one place the parallel fields are checked together ------------
    @classmethod
    def plan(cls, world_size: int = 1, rank: int = 0, sharding="", sharding_parallel_degree: int = -1,
             tensor_parallel_degree: int = -1, pipeline_parallel_degree: int = -1,
             recompute: bool = False, master_grad: bool = False, sharding_parallel_config: str = "",
             tensor_parallel_config: str = "", pipeline_parallel_config: str = "",
             hybrid_parallel_topo_order: Optional[str] = None) -> "Layout":
        """The layout the arguments ask for on ``world_size`` ranks; a ConfigError naming the field otherwise."""
        stage, offload = parse_sharding(sharding)
        mp = _degree("tensor_parallel_degree", tensor_parallel_degree) or 1
        pp = _degree("pipeline_parallel_degree", pipeline_parallel_degree) or 1
        for name, degree in (("tensor_parallel_degree", mp), ("pipeline_parallel_degree", pp)):
            if world_size % degree:
                raise ConfigError(f"{name}={degree} does not divide the {world_size} ranks: dp x sharding x "
                                  f"tensor_parallel_degree x pipeline_parallel_degree must be the number of processes")
        if world_size % (mp * pp):
            raise ConfigError(f"tensor_parallel_degree={mp} x pipeline_parallel_degree={pp} does not divide the "
                              f"{world_size} ranks: dp x sharding x mp x pp must be the number of processes")
        order = topo_order(hybrid_parallel_topo_order)
        tensor_options = config_words("tensor_parallel_config", tensor_parallel_config, TENSOR_CONFIGS)
        pipeline_options = config_words("pipeline_parallel_config", pipeline_parallel_config, PIPELINE_CONFIGS)
        if master_grad and (mp > 1 or pp > 1) and stage >= 2:
            raise ConfigError(f"amp_master_grad with sharding stage{stage} and tensor or pipeline parallel is not "
                              f"supported by paddle: use {option('sharding', 'stage1')}")
        if stage >= 2 and (mp > 1 or pp > 1):
            raise ConfigError(f"sharding stage{stage} with tensor_parallel_degree={mp}, pipeline_parallel_degree={pp} "
                              f"is not supported here (paddle's group_sharded_parallel takes no hybrid groups): use "
                              f"{option('sharding', 'stage1')}")
        sharding_degree = _degree("sharding_parallel_degree", sharding_parallel_degree)
        rest = world_size // (mp * pp)
        if sharding_degree is None:
            sharding_degree = rest if stage else 1
        if sharding_degree > 1 and not stage:
            raise ConfigError(f"sharding_parallel_degree={sharding_degree} but sharding is off: set "
                              f"{option('sharding', 'stage1')} (or stage2, stage3), or {option('sharding_parallel_degree', 1)}")
        if rest * mp * pp != world_size or rest % sharding_degree:
            raise ConfigError(f"sharding_parallel_degree={sharding_degree} does not divide the {world_size} ranks: "
                              "choose a divisor of the number of processes (or -1 for all of them)")
        if stage and sharding_degree == 1:
            stage = 0  # one rank of each shard holds everything: sharding is a no-op, plain data parallel
        dp = rest // sharding_degree
        if master_grad and dp > 1 and not stage:
            raise ConfigError(f"amp_master_grad with plain data parallel over {dp} ranks is not supported: its "
                              "gradients would not be averaged across ranks; add sharding, e.g. "
                              f"{option('sharding', 'stage1')}")
        if master_grad and stage >= 2 and dp > 1:
            raise ConfigError(f"amp_master_grad with sharding stage{stage} and data parallel ({dp} replicas) is not "
                              f"supported by paddle: set {option('sharding_parallel_degree', -1)} (shard over every rank) "
                              "or use stage1")
        options = sharding_configs(sharding_parallel_config, stage)
        return cls(world_size=world_size, rank=rank, dp_degree=dp, sharding_degree=sharding_degree,
                   sharding_stage=stage, offload=offload and stage > 0, mp_degree=mp, pp_degree=pp,
                   recompute=bool(recompute), master_grad=bool(master_grad), sharding_options=options,
                   tensor_options=tensor_options if mp > 1 else (), pipeline_options=pipeline_options if pp > 1 else (),
                   order=order)

    @classmethod
    def from_args(cls, args, world_size: int, rank: int = 0) -> "Layout":
        """:meth:`plan` from a :class:`trainer.TrainingArguments`."""
        return cls.plan(world_size, rank, args.sharding, args.sharding_parallel_degree,
                        args.tensor_parallel_degree, args.pipeline_parallel_degree, args.recompute,
                        args.amp_master_grad, args.sharding_parallel_config, args.tensor_parallel_config,
                        args.pipeline_parallel_config, args.hybrid_parallel_topo_order)

    # ---- what the loop, callbacks, metrics and checkpoints ask --------------------
    @property
    def sharded(self) -> bool:
        """Whether any state (optimizer, gradients, parameters) is split over a sharding group."""
        return self.sharding_stage > 0

    @property
    def shards_optimizer(self) -> bool:
        return self.sharding_stage >= 1

    @property
    def shards_gradients(self) -> bool:
        return self.sharding_stage >= 2

    @property
    def shards_parameters(self) -> bool:
        return self.sharding_stage >= 3

    @property
    def uses_hybrid_topology(self) -> bool:
        """Whether the job runs over fleet's hybrid topology (``fleet.init``) rather than plain ``DataParallel``."""
        return self.sharded or self.mp_degree > 1 or self.pp_degree > 1

    @property
    def clips_in_optimizer(self) -> bool:
        """Whether gradient clipping runs inside paddle's optimizer step (``ClipGradByGlobalNorm``) instead of before
        it: under sharding gradients are reduced (and sharded) only inside the step, so a norm taken before it would
        be each rank's own; under tensor or pipeline parallel fleet's HybridParallelOptimizer turns the clip into one
        whose norm is summed over the model-, pipeline- and sharding-parallel groups (each split parameter counted
        once); with master gradients the optimizer clips the float32 ``main_grad``."""
        return self.sharded or self.master_grad or self.mp_degree > 1 or self.pp_degree > 1

    def _coordinate(self, axis: str) -> int:
        """This rank's place along one hybrid axis (``dp``, ``pp``, ``sharding``, ``mp``) from its rank and
        :attr:`order` (fleet's ``CommunicateTopology`` numbers ranks this way: the last axis varies fastest)."""
        degrees = {"dp": self.dp_degree, "pp": self.pp_degree, "sharding": self.sharding_degree, "mp": self.mp_degree}
        stride = 1
        for name in reversed(self.order):
            if name == axis:
                return (self.rank // stride) % degrees[name]
            stride *= degrees[name]
        raise KeyError(axis)

    @property
    def sharding_rank(self) -> int:
        """This rank's place in its sharding group (0 without sharding)."""
        if self.hcg is not None:
            return self.hcg.get_sharding_parallel_rank()
        return self._coordinate("sharding")

    @property
    def dp_rank(self) -> int:
        """This rank's place in its data-parallel group (the replicas of one shard)."""
        if self.hcg is not None:
            return self.hcg.get_data_parallel_rank()
        return self._coordinate("dp")

    @property
    def mp_rank(self) -> int:
        """This rank's place in its tensor-parallel group: which slice of each split parameter it holds."""
        if self.hcg is not None:
            return self.hcg.get_model_parallel_rank()
        return self._coordinate("mp")

    @property
    def pp_rank(self) -> int:
        """This rank's pipeline stage (0 first)."""
        if self.hcg is not None:
            return self.hcg.get_stage_id()
        return self._coordinate("pp")

    @property
    def data_rank(self) -> int:
        """Which slice of each global batch this rank reads (ranks of one tensor/pipeline group read the same)."""
        return self.dp_rank * self.sharding_degree + self.sharding_rank

    @property
    def data_world_size(self) -> int:
        """How many different slices each global batch is cut into (dp x sharding)."""
        return self.dp_degree * self.sharding_degree

    @property
    def holds_loss(self) -> bool:
        """Whether this rank computes the loss: every rank, except under pipeline parallel, where only the last
        stage does (``trainer.parallel`` gives the other stages the last stage's loss, broadcast in the
        pipeline group, before the loop logs it)."""
        return self.pp_rank == self.pp_degree - 1

    def share_loss(self, loss):
        """``loss`` as the last pipeline stage computed it (:attr:`holds_loss`), on every rank of its pipeline group:
        a broadcast over the pp group, at logging steps and saves only (the other stages' step losses are None and
        their windows sum nothing, ``trainer.parallel.pipeline``); ``loss`` itself without pipeline parallel."""
        if self.pp_degree == 1 or self.hcg is None:
            return loss
        import paddle.distributed as pdist  # paddle only once groups exist: planning runs without it

        loss = loss.clone()
        pdist.broadcast(loss, src=self.hcg.get_rank_from_stage(self.pp_degree - 1), group=self.pp_group)
        return loss

    @property
    def writes_outputs(self) -> bool:
        """Whether this rank's evaluation outputs (predictions, labels, loss, count) are gathered: one rank per data
        slice, the first of its tensor-parallel group on the last pipeline stage; the others hold copies."""
        return self.mp_rank == 0 and self.holds_loss

    @property
    def loss_group(self):
        """The group losses and metrics are averaged over: None, every rank (ranks that read the same data
        hold the same loss, so the mean over all ranks is the mean over the data; under pipeline parallel every
        stage holds the last stage's loss once it is broadcast, see :attr:`holds_loss`)."""
        return None

    @property
    def writes_shard(self) -> bool:
        """Whether this rank writes its part of a checkpoint: the first replica (dp_rank 0) of each shard; without
        sharding, tensor or pipeline parallel only rank 0 holds anything the others do not."""
        return self.dp_rank == 0 and (self.sharded or self.mp_degree > 1 or self.pp_degree > 1 or self.rank == 0)

    @property
    def parameter_group(self):
        """The group a check of the parameters (NaN guard) is reduced over when :attr:`splits_parameters`, so the
        ranks that each hold a part agree: the sharding group (stage 3), the tensor- or pipeline-parallel group
        when only one of them is on, else None (every rank)."""
        if self.mp_degree > 1 or self.pp_degree > 1:
            if not self.shards_parameters and (self.mp_degree == 1) != (self.pp_degree == 1):
                return self.mp_group if self.mp_degree > 1 else self.pp_group
            return None
        return self.sharding_group if self.shards_parameters else None

    @property
    def splits_parameters(self) -> bool:
        """Whether ranks hold different parameters (sharding stage 3's slices, tensor-parallel slices, stages)."""
        return self.shards_parameters or self.mp_degree > 1 or self.pp_degree > 1

    def held_parameters(self, model) -> list:
        """The trainable parameter tensors this rank holds: the parameters themselves, or under stage 3 this rank's
        slices of the sliced ones (paddle keeps them as ``param.fw_storage``; a parameter it leaves whole stays).
        Ask again at each use: under stage 3 the slices are new tensors after every optimizer step."""
        params = [p for p in model.parameters() if not p.stop_gradient]
        if not self.shards_parameters:
            return params
        return [getattr(p, "fw_storage", None) if getattr(p, "fw_storage", None) is not None else p for p in params]

    # ---- what checkpoints and export ask: the model's state as this rank holds it ----------------------------
    # (paddle only inside: the sibling modules import it, planning runs without it)
    def whole_state(self, model) -> dict:
        """``model.state_dict()`` under the whole model's names: a pipeline stage's tensors as the single-card model
        names them (``trainer.layout.stages``); the model's own names otherwise."""
        from .stages import whole_state

        return whole_state(model)

    def slice_names(self, model) -> dict:
        """``{paddle's name of a parameter range: whole-model name}`` for the parameters paddle's sharding stage 3
        holds in slices on this rank (their optimizer states are named ``slice@<paddle name>_...``); empty when
        every parameter is whole here."""
        from .slices import split_parameters
        from .stages import whole_names

        rename = whole_names(model)
        return {"slice@" + s.param.name: rename.get(name, name)
                for name, s in split_parameters(model, self.sharding_rank).items()}

    def saved_blocks(self, model, model_state: dict, opt_state: dict) -> dict:
        """What a save writes of the tensors this rank holds in pieces: cuts, in ``model_state`` and ``opt_state``
        (whole-model names: :meth:`whole_state`, ``param:<name>_...`` / ``master:<name>``), each parameter sharding
        stage 3 holds in slices (and its per-value optimizer states) to the range this rank holds, and returns the
        slice specs of those ranges and of tensor parallel's blocks at their offsets in the whole tensor
        (``{"model/<name>" | "optimizer/<key>": spec}``, ``trainer.checkpoint.shards``); ``{}`` when this rank
        holds whole tensors (the state as it is)."""
        from . import slices

        specs = slices.take_slices(slices.split_parameters(model, self.sharding_rank), model_state, opt_state)
        if self.mp_degree > 1:
            specs.update(slices.block_specs(slices.tensor_parallel_splits(model), self.mp_rank, self.mp_degree,
                                            model_state, opt_state))
        return specs

    def local_state(self, model, model_state: dict, opt_tensors: dict) -> tuple:
        """``(model_state, opt_tensors)`` of a whole-model checkpoint (numpy, whole-model names, whichever layout
        wrote it) as this rank holds them: a pipeline stage's tensors only, this rank's blocks of the parameters
        tensor parallel splits (and of their per-value optimizer states); the state as it is when this rank holds
        the whole model. A ValueError says which tensor does not split over this layout."""
        from .slices import local_blocks, tensor_parallel_splits
        from .stages import held_optimizer_tensors, whole_names

        if self.pp_degree > 1:  # this stage's tensors of the whole model
            own = self.whole_state(model)
            rename = whole_names(model)
            model_state = {k: v for k, v in model_state.items() if k in own}
            opt_tensors = held_optimizer_tensors(opt_tensors, {rename.get(n, n) for n, _ in model.named_parameters()})
        if self.mp_degree > 1:  # this rank's blocks of the whole tensors
            model_state, opt_tensors = dict(model_state), dict(opt_tensors)
            local_blocks(tensor_parallel_splits(model), self.mp_rank, self.mp_degree, model_state, opt_tensors)
        return model_state, opt_tensors

    def whole_model(self, model):
        """The model an export writes: ``model`` itself when this rank holds all of it (a LoRA model: its base with
        the adapter merged in, ``trainer.layout.adapters``); the single-card twin with
        every rank's part put together (tensor parallel's slices gathered over the group, ``trainer.layout.merge``;
        the pipeline's stages, ``trainer.layout.stages``) on rank 0, None on the other ranks, otherwise. A
        collective then: every rank calls it. A ConfigError when the parts cannot be put together here (sharding
        stage 3, or a model without a single-card twin), saying how to export instead."""
        from .. import distributed as dist

        if self.shards_parameters:
            raise ConfigError("export: this run holds its parameters in slices (sharding stage3): export its final "
                              "checkpoint on one process instead: trainer.checkpoint.load.load_weights(model, "
                              "'OUTPUT_DIR/checkpoints/step-N'), then Trainer(model, args).export() (no sharding)")
        if self.mp_degree > 1:
            import paddle

            from .merge import merged_state_dict, single_card_model

            whole = merged_state_dict(model, self.mp_group)  # a collective over the tensor-parallel group: every rank
            if not dist.is_main_process():
                return None
            model = single_card_model(model)
            model.set_state_dict({k: paddle.to_tensor(v) for k, v in whole.items()})
            model.eval()
            return model
        from .adapters import merged
        from .stages import whole_model

        # pipeline parallel: every stage's weights, on rank 0; a LoRA adapter merged into its base (adapters)
        return merged(whole_model(model, self.pp_degree))

    def describe(self) -> dict:
        """Plain JSON the checkpoint manifest records (``ptrain inspect`` shows it)."""
        return {"world_size": self.world_size, "dp_degree": self.dp_degree, "sharding_degree": self.sharding_degree,
                "sharding_stage": self.sharding_stage, "offload": self.offload, "mp_degree": self.mp_degree,
                "pp_degree": self.pp_degree}

    def summary(self) -> str:
        """One line for the log, e.g. ``2 ranks: dp 1 x sharding 2 (stage 2, offload), recompute``."""
        parts = [f"dp {self.dp_degree}"]
        if self.sharded:
            parts.append(f"sharding {self.sharding_degree} (stage {self.sharding_stage}{', offload' if self.offload else ''})")
        for name, degree in (("mp", self.mp_degree), ("pp", self.pp_degree)):
            if degree > 1:
                parts.append(f"{name} {degree}")
        return f"{self.world_size} rank{'s' if self.world_size > 1 else ''}: " + " x ".join(parts) + (
            ", recompute" if self.recompute else "")
