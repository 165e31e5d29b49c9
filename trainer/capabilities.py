"""What this build of paddle can do: one table, asked once, before anything is launched or built.

The table (:class:`Capabilities`) holds the device kind the ranks train on (``gpu`` or ``cpu``: what
``TrainingArguments.device`` resolves to), the backends paddle is compiled with (CUDA, XPU, custom devices), the
collective backend of that device kind (NCCL on GPUs, gloo on CPU) and the operations that backend has
(:data:`OPERATIONS`, measured on paddle 3.3.1: gloo has no ``reduce_scatter``, no ``alltoall`` and nothing on the
calculation stream). Every layout and feature the arguments turn on is one row of :data:`FEATURES`: the device
kinds its paddle code runs on and the collective operations it calls.
:func:`check_arguments` asks the table for every feature the arguments turn on and refuses the first the build
lacks with one :class:`~trainer.errors.ConfigError` line (exit 2) naming the field and what it needs:
``TrainingArguments`` asks at construction (a user's script; every rank of ``ptrain launch``), ``ptrain run``
asks again with the number of processes it is about to launch, before the launcher starts.
:func:`where_it_runs` is the same rows as the documentation's "what runs where" table.

Example::

    >>> from trainer.layout import Layout
    >>> cpu = Capabilities(device="cpu", compiled=())
    >>> cpu.backend, "reduce_scatter" in cpu.operations
    ('gloo', False)
    >>> [f.name for f in features_asked(Layout.plan(world_size=2, sharding="stage3"))]
    ['sharding stage3']
    >>> missing(cpu, Layout.plan(world_size=2, sharding="stage3"))[0].name
    'sharding stage3'
    >>> missing(cpu, Layout.plan(world_size=2, sharding="stage1"))
    []

Tests that run a GPU-only path on CPU through a test-only shim of paddle (``tests/parallel/cpu_*_shim.py``) say so
with :func:`grant_for_tests`, which the shims call when installed: the rows they make run are then not refused in
that process. Nothing in the product calls it.

Importing this module costs no paddle import; :func:`probe` imports paddle (``TrainingArguments`` has then
already imported it to resolve ``device="auto"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from .errors import ConfigError, option

#: the collective backend of each device kind (paddle's ``init_parallel_env``: NCCL on CUDA cards, gloo on CPU)
BACKENDS = {"gpu": "nccl", "cpu": "gloo"}
#: what each backend does; gloo's list is what paddle 3.3.1's ProcessGroupGloo ran on 2 processes (the others raise
#: "ProcessGroupGLOO does not support ..."): no reduce_scatter, no alltoall, nothing with use_calc_stream
OPERATIONS = {
    "nccl": frozenset({"all_reduce", "broadcast", "reduce", "all_gather", "send_recv", "reduce_scatter", "alltoall",
                       "calc_stream"}),
    "gloo": frozenset({"all_reduce", "broadcast", "reduce", "all_gather", "send_recv"}),
}
#: how a refusal names each operation
OPERATION_NAMES = {"reduce_scatter": "reduce_scatter", "alltoall": "alltoall",
                   "calc_stream": "collectives on the calculation stream (use_calc_stream)"}


@dataclass(frozen=True)
class Capabilities:
    """What the ranks of a run can do: their device kind, paddle's compiled backends, the collective backend."""

    device: str                       # gpu | cpu: where the ranks train (TrainingArguments.device, resolved)
    compiled: tuple = ()              # paddle's compiled backends: cuda, xpu, custom:<type>
    granted: Dict[str, str] = field(default_factory=dict, compare=False)  # feature -> the test shim that runs it

    @property
    def backend(self) -> str:
        return BACKENDS[self.device]

    @property
    def operations(self) -> frozenset:
        return OPERATIONS[self.backend]

    def describe(self) -> str:
        """One phrase for a refusal, e.g. ``a CPU build (no CUDA, XPU or custom device), collectives on gloo``."""
        if self.device == "gpu":
            return f"GPUs, collectives on {self.backend}"
        built = "a CPU build (no CUDA, XPU or custom device)" if not self.compiled else \
            f"the CPU of a build with {', '.join(self.compiled)} (device cpu)"
        return f"{built}, collectives on {self.backend}"


@dataclass(frozen=True)
class Feature:
    """One layout or feature: what turns it on and what it needs of the build."""

    name: str                                  # as the "what runs where" table names it
    flag: str                                  # the TrainingArguments field that asks for it
    asked: Callable = field(repr=False)        # asked(layout, args) -> the value that asks for it, or None
    devices: tuple = ("gpu", "cpu")            # device kinds whose paddle code runs it
    operations: tuple = ()                     # collective operations it calls
    why: str = ""                              # what in paddle needs it (the refusal says it)
    instead: Callable = field(default=lambda: "", repr=False)  # instead() -> what to do on this build
    elsewhere: Dict[str, str] = field(default_factory=dict)  # device kind -> what happens there when not refused

    def lacks(self, caps: Capabilities) -> Optional[str]:
        """What ``caps`` lacks for this feature (None: it runs)."""
        if self.name in caps.granted:
            return None
        if caps.device not in self.devices:
            return "a GPU" if self.devices == ("gpu",) else " or ".join(self.devices)
        absent = [OPERATION_NAMES.get(op, op) for op in self.operations if op not in caps.operations]
        return f"{' and '.join(absent)} from the collective backend" if absent else None


def _stage(n: int) -> Callable:
    return lambda layout, args=None: f"stage{n}" + (" offload" if layout.offload else "") \
        if layout.sharding_stage == n and layout.world_size > 1 else None


def _stage1_words(*words: str) -> Callable:
    def asked(layout, args=None):
        found = [w for w in layout.sharding_options if w in words]
        return " ".join(found) if found and layout.sharding_stage == 1 and layout.world_size > 1 else None
    return asked


_GROUP_SHARDED = "paddle's group_sharded_parallel runs on GPU, XPU and custom devices only"
_FUSED = ("enable_stage1_tensor_fusion", "enable_stage1_overlap")

#: every layout and feature the arguments turn on, in the order of the docs' table
FEATURES = (
    Feature("data parallel", "nproc", lambda layout, args=None: layout.dp_degree if layout.dp_degree > 1 else None,
            operations=("all_reduce", "broadcast"), why="paddle's DataParallel all-reduces the gradients"),
    Feature("sharding stage1", "sharding", _stage(1), operations=("all_reduce", "broadcast", "reduce"),
            why="fleet's DygraphShardingOptimizer reduces the gradients and broadcasts the updated parameters"),
    Feature("stage1 tensor fusion, overlap", "sharding_parallel_config", _stage1_words(*_FUSED), devices=("gpu",),
            why="paddle's tensor fusion helper (the fused gradient buffers the overlap runs on) supports GPU, NPU "
                "and XPU only", instead=lambda: f"drop {' and '.join(_FUSED)} from sharding_parallel_config"),
    Feature("stage1 split_param", "sharding_parallel_config", _stage1_words("split_param"), devices=("gpu",),
            operations=("reduce_scatter",),
            why="paddle's sharding V2 reduce-scatters the gradients from fused buffers",
            instead=lambda: "drop split_param from sharding_parallel_config"),
    Feature("sharding stage2", "sharding", _stage(2), devices=("gpu",), why=_GROUP_SHARDED,
            instead=lambda: f"use {option('sharding', 'stage1')}"),
    Feature("sharding stage3", "sharding", _stage(3), devices=("gpu",), why=_GROUP_SHARDED,
            instead=lambda: f"use {option('sharding', 'stage1')}"),
    Feature("tensor parallel", "tensor_parallel_degree",
            lambda layout, args=None: layout.mp_degree if layout.mp_degree > 1 else None, devices=("gpu",),
            operations=("calc_stream",),
            why="fleet's parallel layers all-reduce on the calculation stream and run the c_identity kernel, "
                "which has no CPU kernel", instead=lambda: f"set {option('tensor_parallel_degree', 1)}"),
    Feature("pipeline parallel", "pipeline_parallel_degree",
            lambda layout, args=None: layout.pp_degree if layout.pp_degree > 1 else None, devices=("gpu",),
            operations=("calc_stream",),
            why="its PipelineLayer runs on each rank's card and sends activations on the calculation stream",
            instead=lambda: f"set {option('pipeline_parallel_degree', 1)}"),
    Feature("recompute", "recompute", lambda layout, args=None: True if layout.recompute else None,
            why="paddle's recompute: no collective, no device kernel of its own"),
    Feature("AMP fp16 / bf16", "amp",
            lambda layout, args=None: args.amp if args is not None and args.amp != "off" else None,
            why="paddle's auto_cast acts on GPU, XPU and custom devices only",
            elsewhere={"cpu": "trains in float32, one warning"}),
)


_granted: Dict[str, str] = {}   # grant_for_tests: feature name -> who granted it (a test shim)
_probed: Dict[str, Capabilities] = {}


def grant_for_tests(names, by: str) -> None:
    """TEST-ONLY: in this process, the features ``names`` run whatever the build (a test shim of paddle's GPU-only
    paths, ``by``, makes them run on CPU). The product never calls it."""
    known = {f.name for f in FEATURES}
    for name in names:
        if name not in known:
            raise ValueError(f"grant_for_tests: {name!r} is not a feature of trainer.capabilities.FEATURES")
        _granted[name] = by
    _probed.clear()


def probe(device: str) -> Capabilities:
    """The table for ranks that train on ``device`` (``gpu`` or ``cpu``), asked of paddle once per process."""
    if device not in _probed:
        import paddle

        compiled = tuple(name for name, yes in (("cuda", paddle.device.is_compiled_with_cuda()),
                                                ("xpu", paddle.device.is_compiled_with_xpu())) if yes)
        compiled += tuple(f"custom:{t}" for t in (paddle.device.get_all_custom_device_type() or ()))
        _probed[device] = Capabilities(device="gpu" if device == "gpu" else "cpu", compiled=compiled,
                                       granted=dict(_granted))
    return _probed[device]


def features_asked(layout, args=None) -> List[Feature]:
    """The rows of :data:`FEATURES` that ``layout`` (and ``args``: AMP) turn on."""
    return [f for f in FEATURES if f.asked(layout, args) is not None]


def missing(caps: Capabilities, layout, args=None) -> List[Feature]:
    """The features asked that ``caps`` cannot run."""
    return [f for f in features_asked(layout, args) if f.lacks(caps)]


def refusal(feature: Feature, caps: Capabilities, layout, args=None) -> str:
    """The one line that refuses ``feature`` on ``caps``."""
    value = feature.asked(layout, args)
    return (f"{option(feature.flag, value)} needs {feature.lacks(caps)} ({feature.why}); here: {caps.describe()}: "
            f"run it on GPUs (paddlepaddle-gpu) or {feature.instead()}")


def check_arguments(args, layout) -> None:
    """Refuse, in one ConfigError line, the first feature ``args`` and their ``layout`` ask for that this build
    cannot run; nothing (not even a paddle import) when they ask for nothing beyond data parallel."""
    if not any(f.devices != ("gpu", "cpu") or set(f.operations) - OPERATIONS["gloo"]
               for f in features_asked(layout, args)):
        return
    caps = probe(args.device)
    for feature in missing(caps, layout, args):
        raise ConfigError(refusal(feature, caps, layout, args))


def check_launch(args, world_size: int, gpus: Optional[str] = None) -> None:
    """:func:`check_arguments` for the ``world_size`` processes ``ptrain run`` is about to launch (on the cards
    ``gpus``, its ``--gpus`` flag)."""
    from .layout import Layout

    check_gpus(gpus, args.device)
    check_arguments(args, Layout.from_args(args, world_size))


def check_gpus(gpus: Optional[str], device: Optional[str] = None) -> None:
    """``--gpus`` where paddle sees no GPU: one ConfigError line, before anything is launched. ``device``: the
    device the run's arguments resolved (``ptrain run``); None asks paddle (``ptrain launch``, whose script holds
    the arguments)."""
    if not gpus:
        return
    if device is None:
        import paddle

        device = "gpu" if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0 else "cpu"
    if device != "gpu":
        raise ConfigError(f"--gpus {gpus} needs GPUs that paddle sees; here: {probe(device).describe()}: drop "
                          "--gpus (--nproc N runs N processes on the CPU)")


def where_it_runs() -> str:
    """The "what runs where" table of the docs, from :data:`FEATURES` and :data:`OPERATIONS`."""
    kinds = (("gpu", "GPUs (NCCL)"), ("cpu", "CPU build (gloo)"))
    rows = ["| feature | field | " + " | ".join(title for _, title in kinds) + " | why |", "|---|---|---|---|---|"]
    for feature in FEATURES:
        cells = []
        for kind, _ in kinds:
            lacks = feature.lacks(Capabilities(device=kind))
            cells.append(f"refused (exit 2): needs {lacks}" if lacks else feature.elsewhere.get(kind, "runs"))
        rows.append(f"| {feature.name} | `{feature.flag}` | " + " | ".join(cells) + f" | {feature.why} |")
    return "\n".join(rows)
