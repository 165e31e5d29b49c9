"""TrainingArguments: every option of a run, with one name, one default and one
place where it is validated (``__post_init__``).

Field names follow PaddleNLP's and Hugging Face's ``TrainingArguments`` so that
users can bring their flags along. Arguments load from a YAML mapping and take
command-line overrides written ``--field value`` (or ``--field=value``)::

    >>> args = TrainingArguments.from_yaml_and_cli(None, ["--learning_rate", "0.01", "--max_steps=20"])
    >>> (args.learning_rate, args.max_steps)
    (0.01, 20)
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Iterable, List, Mapping, Optional

from ..capabilities import check_arguments
from ..device import DEVICES  # the one list of device choices (re-exported: trainer.args.DEVICES)
from ..errors import ConfigError, option
from ..layout import Layout
from ..layout.plan import PIPELINE_CONFIGS, SHARDING_CONFIGS, TENSOR_CONFIGS, TOPO_ORDERS
from .aliases import (DEFAULT_REPORTERS, REPORTERS, TRACKERS, config_lines, normalize_aliases_after,
                      normalize_aliases_before, validate_best_model)
from .paddlenlp_fields import PaddleNLPFields, apply_paddlenlp_fields, no_effect_fields

AMP_CHOICES = ("off", "fp16", "bf16")
AMP_LEVELS = ("O1", "O2")
SCHEDULERS = ("constant", "linear", "cosine", "step", "multistep")
OPTIMIZERS = ("adamw", "momentum", "sgd")
STRATEGIES = ("no", "steps", "epoch")
DATA_FINGERPRINTS = ("sizes", "content")  # trainer.checkpoint.fingerprint.MODES


@dataclass
class TrainingArguments(PaddleNLPFields):
    """The arguments of one run. Every field is documented in ``metadata['help']``.

    Bad values raise :class:`trainer.errors.ConfigError` at construction, naming
    the field, the value and what is allowed. Every field of PaddleNLP's
    ``TrainingArguments`` exists too, with PaddleNLP's name, type and default
    (those this project has no option for come from
    :class:`trainer.args.paddlenlp_fields.PaddleNLPFields`; setting one that
    has no effect here is named in a warning).
    """

    # where
    output_dir: str = field(default="output", metadata={"help": "directory for logs, checkpoints and exports"})
    # batch
    per_device_train_batch_size: int = field(default=8, metadata={"help": "samples per process per micro-batch"})
    per_device_eval_batch_size: int = field(default=8, metadata={"help": "samples per process per evaluation batch"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    auto_find_batch_size: bool = field(default=False, metadata={"help": "after an out-of-memory in a step, every rank halves the micro-batch (cutting each per-device batch into pieces) and runs the step again: global batch, samples and schedule unchanged, the size kept in checkpoints (Hugging Face's field; per_device_train_batch_size auto sets it)"})
    dataloader_num_workers: int = field(default=0, metadata={"help": "DataLoader worker processes (0 = load in the main process)"})
    dataloader_drop_last: bool = field(default=False, metadata={"help": "drop the last incomplete training batch of each epoch"})
    dataloader_persistent_workers: bool = field(default=True, metadata={"help": "keep the DataLoader workers from one epoch to the next and from one evaluation to the next within fit(), which shuts them down however it ends (the workers see the dataset as it was when they started; each sample's randomness is unchanged); false: new workers every pass"})
    dataloader_read_ahead: bool = field(default=False, metadata={"help": "with 0 workers, build the next batches in a thread while the step runs (for a dataset that waits on files or C code), unless fetching a batch draws from a global RNG"})
    # length of training
    num_train_epochs: float = field(default=3.0, metadata={"help": "epochs to train (fractions allowed); ignored when max_steps > 0"})
    max_steps: int = field(default=-1, metadata={"help": "optimizer steps to train; > 0 overrides num_train_epochs"})
    # optimizer
    optim: str = field(default="adamw", metadata={"help": "optimizer built when none is given: " + " | ".join(OPTIMIZERS)})
    learning_rate: float = field(default=5e-5, metadata={"help": "peak learning rate"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled (adamw) or L2 (momentum, sgd) decay; never on biases and norm weights"})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2"})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon"})
    momentum: float = field(default=0.9, metadata={"help": "momentum of the momentum optimizer"})
    max_grad_norm: Optional[float] = field(default=None, metadata={"help": "clip gradients to this global L2 norm; None or 0 = no clipping (PaddleNLP's default is 1.0)"})
    # schedule
    lr_scheduler_type: str = field(default="linear", metadata={"help": "decay after warmup: " + " | ".join(SCHEDULERS)})
    warmup_steps: int = field(default=0, metadata={"help": "linear warmup steps; 0 = no warmup (wins over warmup_ratio)"})
    warmup_ratio: float = field(default=0.0, metadata={"help": "warmup as a fraction of all optimizer steps"})
    lr_step_size: int = field(default=30, metadata={"help": "epochs between decays for lr_scheduler_type=step"})
    lr_milestones: List[int] = field(default_factory=lambda: [30, 60, 80], metadata={"help": "epochs at which multistep decays"})
    lr_gamma: float = field(default=0.1, metadata={"help": "decay factor of step and multistep"})
    scale_lr_by_batch: Optional[int] = field(default=None, metadata={"help": "linear scaling rule: peak lr = learning_rate x global batch / this reference batch"})
    # mixed precision
    amp: str = field(default="off", metadata={"help": "mixed precision: " + " | ".join(AMP_CHOICES)})
    amp_level: str = field(default="O1", metadata={"help": "auto_cast level: O1 (lists of ops) or O2 (almost all ops, fp32 master weights)"})
    fp16: bool = field(default=False, metadata={"help": "PaddleNLP spelling of --amp fp16"})
    bf16: bool = field(default=False, metadata={"help": "PaddleNLP spelling of --amp bf16"})
    fp16_opt_level: Optional[str] = field(default=None, metadata={"help": "PaddleNLP spelling of --amp_level (O1 | O2)"})
    # reproducibility
    seed: int = field(default=42, metadata={"help": "seed of paddle, numpy and random, set when fit() starts"})
    data_seed: int = field(default=0, metadata={"help": "epoch e is shuffled with numpy RandomState(data_seed + e); 0 gives paddle's DistributedBatchSampler order"})
    # logging, evaluation, saving
    logging_strategy: str = field(default="steps", metadata={"help": "when to log the training loss: " + " | ".join(STRATEGIES)})
    logging_steps: int = field(default=10, metadata={"help": "log the loss averaged over ranks every N optimizer steps"})
    logging_first_step: bool = field(default=False, metadata={"help": "also log after the first optimizer step"})
    report_to: List[str] = field(default_factory=lambda: list(DEFAULT_REPORTERS), metadata={"help": "what is written beside metrics.jsonl (which every run but none writes): " + ", ".join(REPORTERS) + "; trackers (each an extra): " + ", ".join(TRACKERS) + "; none (or []) = no logger, all = " + ", ".join(DEFAULT_REPORTERS) + " and every tracker installed"})
    disable_tqdm: bool = field(default=False, metadata={"help": "no progress bar"})
    evaluation_strategy: str = field(default="epoch", metadata={"help": "when to evaluate: " + " | ".join(STRATEGIES)})
    eval_steps: int = field(default=0, metadata={"help": "evaluate every N steps (with evaluation_strategy=steps)"})
    save_strategy: str = field(default="steps", metadata={"help": "when to save a checkpoint: " + " | ".join(STRATEGIES)})
    save_steps: int = field(default=500, metadata={"help": "save every N steps (with save_strategy=steps)"})
    save_total_limit: Optional[int] = field(default=3, metadata={"help": "keep the newest N complete checkpoints, plus the best by metric_for_best_model; None = keep all. Disk: up to N+1 checkpoints of about 12 bytes per parameter each with adamw (weights + 2 moments; 8 with momentum, 4 with sgd)"})
    metric_for_best_model: Optional[str] = field(default=None, metadata={"help": "evaluation metric that ranks checkpoints, e.g. eval_accuracy"})
    greater_is_better: Optional[bool] = field(default=None, metadata={"help": "whether a larger metric_for_best_model is better (default: not for *loss)"})
    load_best_model_at_end: bool = field(default=False, metadata={"help": "after training, load the weights of the best checkpoint by metric_for_best_model (default eval_loss) into the model"})
    flush_at_end: bool = field(default=True, metadata={"help": "the last step always logs, evaluates and saves (when their strategy is not no); PaddleNLP's Trainer does not (false)"})
    save_async: bool = field(default=True, metadata={"help": "write checkpoint files in a background thread while training goes on"})
    save_on_preemption: bool = field(default=True, metadata={"help": "on SIGTERM, SIGINT, SIGHUP or SIGUSR1 save the step the ranks stop at, even with save_strategy no; false: save nothing then (the exit line says what is on disk)"})
    resume_from_checkpoint: Optional[str] = field(default=None, metadata={"help": "checkpoint directory, or auto (or true) for the latest in output_dir"})
    resume_allow_data_change: bool = field(default=False, metadata={"help": "resume even when the training data's fingerprint (an ImageFolder's files and sizes, or the dataset's fingerprint()) differs from the checkpoint's; by default that is refused (exit 2)"})
    data_fingerprint: str = field(default="sizes", metadata={"help": "what each checkpoint records of the training data's files and a resume compares: sizes (their paths and sizes, one os.stat per file) | content (also a blake2b hash of every file the dataset names with data_files(), read on rank 0 at the first save and at a resume: about 200 s of CPU per million 110 KB files, plus reading them; docs/how-to/resume.md)"})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "start afresh in an output_dir that holds another run's checkpoints: they are moved aside, then deleted"})
    # placement
    device: str = field(default="auto", metadata={"help": "auto (gpu when paddle is compiled with CUDA and sees one) | cpu | gpu; auto is resolved at construction, so paddle.set_device(args.device) works"})
    find_unused_parameters: bool = field(default=False, metadata={"help": "DataParallel: allow parameters that get no gradient"})
    # the model over ranks: recompute, sharding, tensor and pipeline parallel (trainer.layout plans them together,
    # trainer.parallel applies them; PaddleNLP's names, types and defaults)
    recompute: bool = field(default=False, metadata={"help": "recompute activations in the backward pass instead of keeping them: a PaddleNLP model through its enable_recompute switch, any other model block by block (the children of its LayerLists, or recompute_modules) under paddle's non-reentrant recompute"})
    recompute_modules: Optional[List[str]] = field(default=None, metadata={"help": "with recompute: the sublayers to recompute, by path in named_sublayers() (a LayerList stands for its children) or class name; default every LayerList's children"})
    sharding: str = field(default="", metadata={"help": "shard state over ranks: stage1 (optimizer states), stage2 (+ gradients), stage3 (+ parameters); add offload to keep them in host memory (e.g. 'stage2 offload'); empty = off"})
    sharding_parallel_degree: int = field(default=-1, metadata={"help": "ranks per sharding group; -1 = all of them; the rest replicate the shards (data parallel)"})
    sharding_parallel_config: str = field(default="", metadata={"help": "PaddleNLP's sharding options, space-separated: " + ", ".join(SHARDING_CONFIGS) + " (enable_stage2_overlap with stage2, the others with stage1)"})
    tensor_parallel_degree: int = field(default=-1, metadata={"help": "ranks per tensor-parallel group (fleet's TensorParallel over its hybrid topology; the model is built from fleet's parallel layers: docs/how-to/model-parallel.md); -1 or 1 = off"})
    pipeline_parallel_degree: int = field(default=-1, metadata={"help": "pipeline stages (fleet's PipelineParallel over its hybrid topology; the model is a PipelineLayer: docs/how-to/pipeline-parallel.md); -1 or 1 = off"})
    tensor_parallel_config: str = field(default="", metadata={"help": "PaddleNLP's tensor-parallel options, space-separated: " + ", ".join(TENSOR_CONFIGS) + " (fleet's mp_configs; enable_delay_scale_loss is accepted)"})
    pipeline_parallel_config: str = field(default="", metadata={"help": "PaddleNLP's pipeline options, space-separated, into fleet's pp_configs and pipeline_configs: " + ", ".join(PIPELINE_CONFIGS)})
    hybrid_parallel_topo_order: Optional[str] = field(default=None, metadata={"help": "fleet's order of the hybrid axes, outermost first: " + "; ".join(f"{k} ({', '.join(v)})" for k, v in TOPO_ORDERS.items()) + "; None = pp_first, PaddleNLP's default"})
    amp_master_grad: bool = field(default=False, metadata={"help": "with amp_level O2: keep float32 gradients (paddle's main_grad) beside the low-precision weights; the optimizer clips them; several processes need sharding"})
    # data columns
    label_names: Optional[List[str]] = field(default=None, metadata={"help": "batch keys that hold the labels (default: labels)"})
    remove_unused_columns: bool = field(default=True, metadata={"help": "drop sample keys the model's forward does not take (labels kept)"})
    # what a script should run (read by scripts, as in PaddleNLP; the Trainer itself ignores them)
    do_train: bool = field(default=False, metadata={"help": "for scripts: run training"})
    do_eval: bool = field(default=False, metadata={"help": "for scripts: run evaluation"})
    do_predict: bool = field(default=False, metadata={"help": "for scripts: run prediction"})
    do_export: bool = field(default=False, metadata={"help": "for scripts: export an inference model"})

    def __new__(cls, *args, **kwargs):
        # runs before the dataclass __init__: an unknown keyword is the CLI's "did you mean" ConfigError,
        # not a bare TypeError
        cls.check_keys(kwargs, source=f"{cls.__name__}(...)")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if isinstance(self.sharding, (list, tuple)):  # PaddleNLP's parsed form: a list of stage names
            self.sharding = " ".join(str(getattr(w, "value", w)) for w in self.sharding)
        normalize_aliases_before(self)
        self._coerce_types()
        apply_paddlenlp_fields(self)
        normalize_aliases_after(self)
        self._validate()

    # ---- validation: the one place -------------------------------------
    def _validate(self) -> None:
        positive = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                    "logging_steps", "lr_step_size")
        for name in positive:
            _check(name, getattr(self, name), getattr(self, name) > 0, "an integer > 0")
        _check("dataloader_num_workers", self.dataloader_num_workers, self.dataloader_num_workers >= 0, "an integer >= 0")
        _check("learning_rate", self.learning_rate, self.learning_rate >= 0, "a number >= 0 (0 trains nothing, as in PaddleNLP)")
        _check("weight_decay", self.weight_decay, self.weight_decay >= 0, "a number >= 0")
        _check("num_train_epochs", self.num_train_epochs, self.num_train_epochs > 0 or self.max_steps > 0,
               "a number > 0 (or set max_steps > 0)")
        _check("max_steps", self.max_steps, self.max_steps == -1 or self.max_steps > 0, "-1 (use num_train_epochs) or an integer > 0")
        _check("adam_beta1", self.adam_beta1, 0 <= self.adam_beta1 < 1, "a number in [0, 1)")
        _check("adam_beta2", self.adam_beta2, 0 <= self.adam_beta2 < 1, "a number in [0, 1)")
        _check("adam_epsilon", self.adam_epsilon, self.adam_epsilon > 0, "a number > 0")
        _check("momentum", self.momentum, 0 <= self.momentum < 1, "a number in [0, 1)")
        _check("max_grad_norm", self.max_grad_norm, self.max_grad_norm is None or self.max_grad_norm > 0,
               "None (no clipping) or a number > 0")
        _check("warmup_steps", self.warmup_steps, self.warmup_steps >= 0, "an integer >= 0")
        _check("warmup_ratio", self.warmup_ratio, 0 <= self.warmup_ratio < 1, "a number in [0, 1)")
        _check("lr_gamma", self.lr_gamma, 0 < self.lr_gamma <= 1, "a number in (0, 1]")
        _check("lr_milestones", self.lr_milestones,
               all(isinstance(m, int) and m > 0 for m in self.lr_milestones) and list(self.lr_milestones) == sorted(self.lr_milestones),
               "increasing positive epoch numbers")
        _check("scale_lr_by_batch", self.scale_lr_by_batch, self.scale_lr_by_batch is None or self.scale_lr_by_batch > 0,
               "None or a reference batch size > 0")
        _check("save_total_limit", self.save_total_limit, self.save_total_limit is None or self.save_total_limit > 0,
               "None (keep all) or an integer > 0")
        _check("eval_steps", self.eval_steps, self.eval_steps >= 0, "an integer >= 0")
        _check("eval_accumulation_steps", self.eval_accumulation_steps,
               self.eval_accumulation_steps is None or self.eval_accumulation_steps > 0, "None or an integer > 0")
        _check("save_steps", self.save_steps, self.save_steps >= 0, "an integer >= 0")
        _choice("optim", self.optim, OPTIMIZERS)
        _choice("lr_scheduler_type", self.lr_scheduler_type, SCHEDULERS)
        _choice("amp", self.amp, AMP_CHOICES)
        _choice("amp_level", self.amp_level, AMP_LEVELS)
        _choice("data_fingerprint", self.data_fingerprint, DATA_FINGERPRINTS)
        _choice("evaluation_strategy", self.evaluation_strategy, STRATEGIES)
        _choice("save_strategy", self.save_strategy, STRATEGIES)
        _choice("logging_strategy", self.logging_strategy, STRATEGIES)
        _choice("device", self.device, DEVICES)
        for reporter in self.report_to:
            _choice("report_to", reporter, REPORTERS + TRACKERS)
        if self.evaluation_strategy == "steps" and self.eval_steps == 0:
            raise ConfigError(f"eval_steps=0 but evaluation_strategy='steps': set {option('eval_steps')} to N > 0 or "
                              "another evaluation_strategy")
        if self.save_strategy == "steps" and self.save_steps == 0:
            raise ConfigError(f"save_steps=0 but save_strategy='steps': set {option('save_steps')} to N > 0 or "
                              f"{option('save_strategy', 'no')}")
        validate_best_model(self)
        if self.amp_master_grad and (self.amp == "off" or self.amp_level != "O2"):
            raise ConfigError(f"amp_master_grad=True needs low-precision weights: set {option('amp', 'bf16')} (or fp16) "
                              f"and {option('amp_level', 'O2')}, or {option('amp_master_grad', False)}")
        # the parallel fields, checked together and planned once: the run's Layout (self.layout), which the Trainer
        # takes and the *_rank properties read. On the launch's ranks; a process outside a launch (ptrain's launcher
        # itself, before it starts the ranks) checks them on the fewest ranks the degrees ask for
        launched = "PADDLE_TRAINERS_NUM" in os.environ
        layout = Layout.from_args(self, self.world_size if launched else max(self.world_size, self._least_ranks()),
                                  self.process_index)
        check_arguments(self, layout)  # what this build cannot run: one line, before any group or model is made
        self._planned_layout = layout  # not a field: to_dict() and the checkpoint's saved arguments stay as they are
        if launched and layout.world_size > 1 and (layout.mp_degree > 1 or layout.pp_degree > 1):
            # fleet's parallel layers read its groups when the model is built after these arguments (as in PaddleNLP)
            from ..parallel.apply import init_topology

            init_topology(layout, self)
        if not str(self.output_dir).strip():
            raise ConfigError(f"output_dir is empty: give a directory, e.g. {option('output_dir', 'runs/exp1')}")

    def _least_ranks(self) -> int:
        return max(int(self.tensor_parallel_degree), 1) * max(int(self.pipeline_parallel_degree), 1) * \
            max(int(self.sharding_parallel_degree), 1)

    def _coerce_types(self) -> None:
        """Turn strings (from YAML or the command line) into the field's type."""
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            setattr(self, f.name, _convert(f.name, getattr(self, f.name), hints[f.name]))

    # ---- derived values -------------------------------------------------
    @property
    def greater_is_better_resolved(self) -> bool:
        """Whether larger ``metric_for_best_model`` values are better."""
        if self.greater_is_better is not None:
            return self.greater_is_better
        return not (self.metric_for_best_model or "loss").endswith("loss")

    # ---- loading --------------------------------------------------------
    @classmethod
    def field_names(cls) -> list:
        return [f.name for f in dataclasses.fields(cls)]

    @staticmethod
    def no_effect_fields() -> list:
        """PaddleNLP's fields accepted without an effect here (they never block a resume)."""
        return no_effect_fields()

    @classmethod
    def check_keys(cls, values: Mapping[str, Any], source: str = "arguments") -> None:
        """An unknown key is an error naming ``source`` that suggests the closest field."""
        names = cls.field_names()
        for key in values:
            if key not in names:
                raise ConfigError(f"unknown training argument {str(key)!r} in {source}{_suggest(str(key), names)}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "arguments") -> "TrainingArguments":
        """Build from a mapping; an unknown key is an error that suggests the closest field."""
        cls.check_keys(values, source)
        return cls(**dict(values))

    @classmethod
    def from_yaml_and_cli(cls, yaml_path: Optional[str], argv: Iterable[str] = (),
                          base: Optional[Mapping[str, Any]] = None) -> "TrainingArguments":
        """Defaults < ``base`` < the YAML file < ``--field value`` overrides."""
        values = dict(base or {})
        if yaml_path:
            values.update(load_yaml_mapping(yaml_path))
        values.update(parse_overrides(argv, cls.field_names()))
        return cls.from_dict(values, source=yaml_path or "the command line")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    # ---- read-only facts scripts log (PaddleNLP names) ---------------------
    @property
    def world_size(self) -> int:
        """Processes in this run (from the launcher's environment)."""
        return int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))

    @property
    def process_index(self) -> int:
        """This process's global rank."""
        return int(os.environ.get("PADDLE_TRAINER_ID", "0"))

    @property
    def layout(self) -> Layout:
        """The run's :class:`trainer.layout.Layout`, planned once from these fields when they were checked (on the
        launch's ranks; outside a launch on the fewest ranks the degrees ask for). Not a field: ``to_dict()`` and
        the checkpoint's saved arguments do not hold it. ``Trainer`` takes it (:meth:`layout_for`)."""
        return self._planned_layout

    def layout_for(self, world_size: int, rank: int) -> Layout:
        """The Layout of a process that is rank ``rank`` of ``world_size``: :attr:`layout` itself when the
        arguments were checked for that world (every launched rank); planned anew only where the world differs,
        for a process outside a launch whose degrees asked for more ranks than it has (a ConfigError then names
        the degree that does not divide its ranks)."""
        planned = self._planned_layout
        if (planned.world_size, planned.rank) == (world_size, rank):
            return planned
        return Layout.from_args(self, world_size, rank)

    @property
    def tensor_parallel_rank(self) -> int:
        """This rank's place in its tensor-parallel group (PaddleNLP scripts give it to a model's config)."""
        return self.layout.mp_rank

    @property
    def pipeline_parallel_rank(self) -> int:
        """This rank's pipeline stage."""
        return self.layout.pp_rank

    @property
    def data_parallel_rank(self) -> int:
        """This rank's place in its data-parallel group."""
        return self.layout.dp_rank

    @property
    def sharding_parallel_rank(self) -> int:
        """This rank's place in its sharding group."""
        return self.layout.sharding_rank

    @property
    def requested_device(self) -> str:
        """``device`` as the user gave it: ``auto`` when it was resolved here (``device`` then holds the result)."""
        return "auto" if getattr(self, "_device_was_auto", False) else self.device

    @property
    def train_batch_size(self) -> int:
        return self.per_device_train_batch_size

    @property
    def eval_batch_size(self) -> int:
        return self.per_device_eval_batch_size

    @property
    def should_save(self) -> bool:
        """Whether this process writes files (the main process)."""
        return self.process_index == 0

    def print_config(self, args=None, key: str = "") -> None:
        """Log every field of ``args`` (default: these arguments), one per line, as PaddleNLP does."""
        import logging

        log = logging.getLogger("trainer")
        for line in config_lines(args if args is not None else self, key):
            log.info(line)


# ---- helpers --------------------------------------------------------------
def _check(name: str, value: Any, ok: bool, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r} is not allowed: {name} must be {allowed}")


def _choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not allowed: choose one of {', '.join(choices)}{_suggest(str(value), choices)}")


def _suggest(word: str, names: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(names), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


def coerce_fields(cls: type, values: Mapping[str, Any]) -> dict:
    """Coerce ``values`` (strings from YAML or the command line) to the types of dataclass ``cls``'s fields."""
    hints = typing.get_type_hints(cls)
    return {k: (_convert(k, v, hints[k]) if k in hints else v) for k, v in values.items()}


def _convert(name: str, value: Any, hint: Any) -> Any:
    """Coerce ``value`` to the annotated type, raising ConfigError naming the field."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union and type(None) in args:  # Optional[X]
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "")):
            return None
        hint = next(a for a in args if a is not type(None))
        origin = typing.get_origin(hint)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(f"{name}={value!r} is not allowed: {name} must be true or false")
    if hint is int:
        if isinstance(value, bool):
            raise ConfigError(f"{name}={value!r} is not allowed: {name} must be an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(str(value).strip())
        except ValueError:
            raise ConfigError(f"{name}={value!r} is not allowed: {name} must be an integer") from None
    if hint is float:
        if isinstance(value, bool):
            raise ConfigError(f"{name}={value!r} is not allowed: {name} must be a number")
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{name}={value!r} is not allowed: {name} must be a number") from None
        if not math.isfinite(number):
            raise ConfigError(f"{name}={value!r} is not allowed: {name} must be a finite number")
        return number
    if hint is list or origin is list:
        if isinstance(value, str):
            items = [v.strip() for v in value.split(",") if v.strip()]
            value = [_maybe_int(v) for v in items]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}={value!r} is not allowed: {name} must be a list (comma-separated on the command line)")
        return list(value)
    if hint is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{name}={value!r} is not allowed: {name} must be a string")
        return os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    return value


def _maybe_int(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


def parse_overrides(argv: Iterable[str], names: Iterable[str]) -> dict:
    """Parse ``--field value`` / ``--field=value`` pairs into a dict of strings."""
    names = list(names)
    argv = list(argv)
    out: dict = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--"):
            raise ConfigError(f"unexpected argument {token!r}: overrides are written --field value")
        key, eq, value = token[2:].partition("=")
        key = key.replace("-", "_")
        if key not in names:
            raise ConfigError(f"unknown training argument {'--' + key!r}{_suggest(key, names)}")
        if not eq:
            if i + 1 >= len(argv) or (argv[i + 1].startswith("--") and not _is_number(argv[i + 1])):
                raise ConfigError(f"{'--' + key!r} needs a value: write --{key.strip()} VALUE")
            value = argv[i + 1]
            i += 1
        out[key] = value
        i += 1
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def load_yaml_mapping(path: str) -> dict:
    """Read a YAML mapping; errors name the file (and the line when it does not parse)."""
    import yaml

    if not os.path.isfile(path):
        raise ConfigError(f"config file {path} does not exist: check the path")
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f)
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}): save the file as UTF-8") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(f"{path}{where}: YAML does not parse ({problem}); fix the file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of field: value, got {type(data).__name__}")
    return data
