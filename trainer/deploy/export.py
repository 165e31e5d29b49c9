"""Export an inference model and prove it matches the trained one.

``export_inference_model(trainer)`` (what ``Trainer.export()`` and
``callbacks.Export`` call) saves the model with ``paddle.jit.save``, loads the
files back with ``paddle.inference`` (the deployment runtime, not the jit
loader), runs both on the same sample batch and raises
:class:`~trainer.errors.TrainingError` when the outputs differ beyond the
tolerance (``|deployed - dygraph| <= atol + rtol * |dygraph|``, element-wise,
as ``np.testing.assert_allclose``). Nothing is published unless it matches.

The check runs where the model trained (:func:`check_settings`): on a GPU
the predictor runs on the same card and the default tolerance is 1e-2 (GPU
kernels differ between the dygraph and the inference runtime, and Ampere+
cards use TF32 for float32 matmuls and convolutions by default); on CPU it is
1e-5. A model whose parameters are float16 or bfloat16 (AMP O2) is exported as
a float32 copy, so the predictor takes and returns float32 as for any model;
its weights hold the low-precision values, and the dygraph reference is that
float32 copy's output.

Files in the export directory (default ``output_dir/inference``)::

    model.json        the program; paddle 3 writes PIR JSON (model.pdmodel with
                      the legacy program IR, FLAGS_enable_pir_api=0)
    model.pdiparams   the weights
    export.json       inputs (name, shape, dtype), outputs, files, the max abs
                      difference measured, tolerances, paddle version

The input spec is the ``input_spec`` argument (a list of
``paddle.static.InputSpec``) or is read off a sample batch (the given one,
else the first samples of ``eval_dataset`` or ``train_dataset`` through the
trainer's ``collate_fn``): the batch dimension becomes dynamic, and so does
dimension 1 of integer inputs of rank >= 2 (token ids, masks: texts differ in
length). Batches follow the trainer's conventions: ``(inputs..., labels)``
tuples, or dicts whose keys are ``model.forward`` parameters (``labels`` is
dropped). Load an export with ``trainer.deploy.predictor``'s :func:`create_predictor` and
:func:`run_predictor`::

    predictor = create_predictor("runs/digits/inference")
    (logits,) = run_predictor(predictor, [features])
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, List, Optional, Sequence

import numpy as np
import paddle
from paddle.static import InputSpec

from .. import distributed as dist
from ..errors import ConfigError, DataError, TrainingError
from ..tensors import to_numpy
from .predictor import PARAMS_FILE, PREFIX, create_predictor, model_files, run_predictor

logger = logging.getLogger("trainer")

REPORT_FILE = "export.json"
SAMPLE_ROWS = 4


@dataclass
class ExportResult:
    """What an export wrote and how closely the deployed model matched the dygraph one."""

    path: str
    model_file: str
    params_file: str
    inputs: List[dict]
    outputs: List[dict]
    max_abs_diff: float
    rtol: float
    atol: float
    sample_rows: int
    device: str = "cpu"          # where the predictor ran for the check (the training device)
    paddle: str = field(default_factory=lambda: paddle.__version__)


# ---- sample batches and input specs -----------------------------------------------------
def _sample_batch(trainer) -> Any:
    dataset = trainer.eval_dataset if trainer.eval_dataset is not None else trainer.train_dataset
    if isinstance(dataset, dict):  # several evaluation sets: the first one's samples
        dataset = next(iter(dataset.values()))
    if dataset is None:
        raise ConfigError("export needs input_spec, a sample_batch, or a train/eval dataset to read one from: "
                          "pass input_spec=[paddle.static.InputSpec(...)] or sample_batch=...")
    loader = paddle.io.DataLoader(dataset, batch_size=SAMPLE_ROWS, shuffle=False, drop_last=False,
                                  collate_fn=trainer.collate_fn, num_workers=0)
    try:
        return next(iter(loader))
    except StopIteration:
        raise DataError("export: the dataset to read a sample batch from is empty: pass sample_batch=...") from None


def _forward_params(model: paddle.nn.Layer) -> List[inspect.Parameter]:
    params = list(inspect.signature(model.forward).parameters.values())
    return [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def split_batch(model: paddle.nn.Layer, batch: Any) -> tuple:
    """``(positional model inputs, their names)`` from a batch in the trainer's layout.

    Dict batches become the positional arguments of ``model.forward`` up to the
    last key given; parameters in between keep their defaults (not tensors).
    """
    params = _forward_params(model)
    if isinstance(batch, dict):
        batch = {k: v for k, v in batch.items() if k != "labels"}
        names = [p.name for p in params]
        unknown = [k for k in batch if k not in names]
        if unknown:
            raise ConfigError(f"export: batch keys {unknown} are not parameters of {type(model).__name__}.forward "
                              f"({', '.join(names)}): pass input_spec=[...] in forward's order")
        last = max(names.index(k) for k in batch)
        values = [batch[p.name] if p.name in batch else p.default for p in params[:last + 1]]
        return values, names[:last + 1]
    if isinstance(batch, (list, tuple)):
        values = list(batch[:1] if len(batch) == 1 else batch[:-1])
    else:
        values = [batch]
    names = [p.name for p in params[:len(values)]]
    names += [f"input_{i}" for i in range(len(names), len(values))]
    return values, names


def spec_from_inputs(values: Sequence[Any], names: Sequence[str]) -> List[Any]:
    """InputSpecs for the tensors of ``values`` (batch dim dynamic; dim 1 too for integer inputs of rank >= 2);
    other values (defaults such as None) are kept as they are."""
    specs = []
    for value, name in zip(values, names):
        if isinstance(value, np.ndarray):
            value = paddle.to_tensor(value)
        if not isinstance(value, paddle.Tensor):
            specs.append(value)
            continue
        shape = [None] + list(value.shape[1:])
        if len(shape) >= 2 and not (value.is_floating_point() or value.dtype == paddle.bool):
            shape[1] = None
        specs.append(InputSpec(shape=shape, dtype=value.dtype, name=name))
    return specs


def _synthetic_inputs(specs: Sequence[Any]) -> List[Any]:
    """A 2-row batch matching ``specs`` (dynamic dims 2 or 8), for a check without data."""
    rng = np.random.RandomState(0)
    out = []
    for spec in specs:
        if not isinstance(spec, InputSpec):
            out.append(spec)
            continue
        shape = [2 if i == 0 else 8 if d is None or d < 0 else d for i, d in enumerate(spec.shape)]
        dtype = str(spec.dtype).replace("paddle.", "")
        if "float" in dtype:
            out.append(paddle.to_tensor(rng.randn(*shape).astype(dtype)))
        else:
            out.append(paddle.to_tensor(np.zeros(shape, dtype=dtype)))
    return out


def _tensors(outputs: Any) -> List[paddle.Tensor]:
    flat = paddle.utils.flatten(outputs.to_tuple() if hasattr(outputs, "to_tuple") else outputs)
    return [t for t in flat if isinstance(t, paddle.Tensor)]


# ---- where and how closely the check compares ---------------------------------------------------
TOLERANCES = {"cpu": 1e-5, "gpu": 1e-2}


def check_settings(device: str, rtol: Optional[float] = None, atol: Optional[float] = None) -> tuple:
    """``(predictor device, rtol, atol)`` for a model trained on ``device`` (``cpu`` or ``gpu:N``).

    The predictor runs on the training device (a GPU model is checked on its
    card, not against a CPU predictor); tolerances not given default to
    ``TOLERANCES`` of that device kind. On a GPU a tolerance given tighter than
    the GPU default is raised to it (tolerances in recipes are written for CPU
    runs; TF32 and the two runtimes' kernels cannot match more closely).

        >>> check_settings("gpu:3")
        ('gpu:3', 0.01, 0.01)
        >>> check_settings("gpu:0", rtol=1e-4, atol=0.05)
        ('gpu:0', 0.01, 0.05)
        >>> check_settings("cpu", atol=1e-4)
        ('cpu', 1e-05, 0.0001)
    """
    kind = "gpu" if device.startswith("gpu") else "cpu"
    predictor_device = device if kind == "gpu" else "cpu"
    default = TOLERANCES[kind]

    def pick(given: Optional[float]) -> float:
        if given is None:
            return default
        return max(given, default) if kind == "gpu" else given

    return predictor_device, pick(rtol), pick(atol)


def float32_model(model: paddle.nn.Layer) -> paddle.nn.Layer:
    """``model`` itself when its floating parameters and buffers are float32, else a float32 copy
    (AMP O2 leaves float16/bfloat16 weights; the deployed model takes float32 inputs)."""
    tensors = list(model.parameters()) + list(model.buffers())
    if not any(t.dtype in (paddle.float16, paddle.bfloat16) for t in tensors):
        return model
    copy_ = copy.deepcopy(model)
    copy_.to(dtype="float32")
    return copy_


# ---- export ----------------------------------------------------------------------------------
def export_model(model: paddle.nn.Layer, path: str, input_spec: Optional[Sequence[Any]] = None,
                 sample_inputs: Optional[Sequence[Any]] = None, input_names: Optional[Sequence[str]] = None,
                 rtol: Optional[float] = None, atol: Optional[float] = None) -> ExportResult:
    """Save ``model`` to directory ``path``, reload it with ``paddle.inference``, compare; return the result.

    ``input_spec``: the positional inputs of ``model.forward`` (InputSpecs, or
    plain values for non-tensor arguments); read off ``sample_inputs`` when
    None. ``sample_inputs``: positional inputs for the check; synthesised from
    the spec when None. The files are written to a temporary directory next to
    ``path`` and renamed into place only after the check passed. ``rtol`` /
    ``atol``: None for the training device's default (:func:`check_settings`).
    """
    device, rtol, atol = check_settings(paddle.get_device(), rtol, atol)
    model = float32_model(model)
    if input_spec is None and sample_inputs is None:
        raise ConfigError("export_model needs input_spec or sample_inputs")
    if input_spec is None:
        input_spec = spec_from_inputs(sample_inputs, input_names or [f"input_{i}" for i in range(len(sample_inputs))])
    if not any(isinstance(s, InputSpec) for s in input_spec):
        raise ConfigError(f"input_spec={list(input_spec)!r} has no paddle.static.InputSpec: give one per tensor input")
    if sample_inputs is None:
        sample_inputs = _synthetic_inputs(input_spec)
    sample_inputs = [paddle.to_tensor(v) if isinstance(v, np.ndarray) else v for v in sample_inputs]

    final = os.path.abspath(path)
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".tmp-{os.path.basename(final)}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    was_training = model.training
    model.eval()
    try:
        try:
            _config_read_in_python(model)
            paddle.jit.save(model, os.path.join(tmp, PREFIX), input_spec=list(input_spec))
        except Exception as exc:  # paddle raises TypeError/ValueError/RuntimeError from its converter
            last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1].strip()
            raise TrainingError(f"paddle.jit.save could not convert {type(model).__name__}.forward with input_spec "
                                f"{[getattr(s, 'name', s) for s in input_spec]}: {last}; give input_spec=[...] that "
                                "matches forward, or make forward convertible (see paddle.jit.to_static)") from exc
        with paddle.no_grad():
            raw = model(*sample_inputs)
        expected = [to_numpy(t) for t in _tensors(raw)]
        result = _check(tmp, input_spec, sample_inputs, expected, _output_keys(raw, len(expected)), rtol, atol,
                        device)
        _publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if was_training:
            model.train()
    result.path = final
    result.model_file = os.path.join(final, os.path.basename(result.model_file))
    result.params_file = os.path.join(final, PARAMS_FILE)
    return result


def _config_read_in_python(model: paddle.nn.Layer) -> None:
    """Let paddle.jit run a model's ``config`` object as Python rather than convert it (PaddleFormers' configs: a
    converted ``PretrainedConfig.__getattribute__`` loses its zero-argument ``super()`` and recurses until Python's
    limit). Its values are constants of the exported program either way."""
    config = getattr(model, "config", None)
    if config is None or type(config).__module__ == "builtins":
        return
    # never a module that holds a layer of the model (a config class beside its model, as models/ernie's tensor-parallel
    # one: ignoring that module would leave the forward unconverted)
    layers = {c.__module__ for layer in model.sublayers(include_self=True) for c in type(layer).__mro__}
    modules = {sys.modules.get(c.__module__) for c in type(config).__mro__
               if c.__module__ != "builtins" and c.__module__ not in layers}
    paddle.jit.ignore_module([m for m in modules if m is not None])


def _output_keys(outputs: Any, n: int) -> List[str]:
    """What each flattened output is in the dygraph model's terms: dict keys (paddle.jit orders them
    sorted, as ``paddle.utils.flatten`` does), else positions."""
    if isinstance(outputs, dict) and all(isinstance(v, paddle.Tensor) for v in outputs.values()):
        return sorted(outputs)
    return [str(i) for i in range(n)]


def _check(tmp: str, input_spec, sample_inputs, expected: List[np.ndarray], keys: List[str],
           rtol: float, atol: float, device: str = "cpu") -> ExportResult:
    specs = [(s, v) for s, v in zip(input_spec, sample_inputs) if isinstance(s, InputSpec)]
    predictor = create_predictor(tmp, device=device)
    feed_names = list(predictor.get_input_names())
    names = [s.name for s, _ in specs]
    if sorted(names) != sorted(feed_names):  # unnamed specs: the predictor names them; keep spec order
        names = feed_names
    got = run_predictor(predictor, [v.numpy() for _, v in specs], names)
    fetch_names = list(predictor.get_output_names())
    if len(got) != len(expected):
        raise TrainingError(f"the exported model returns {len(got)} outputs, the dygraph model {len(expected)}: "
                            "return tensors (or a tuple/dict of tensors) from forward")
    max_diff = 0.0
    for name, a, b in zip(keys, got, expected):
        if a.shape != b.shape:
            raise TrainingError(f"exported output {name} has shape {list(a.shape)}, the dygraph model's {list(b.shape)}")
        a64, b64 = a.astype("float64"), b.astype("float64")
        diff = float(np.max(np.abs(a64 - b64))) if a.size else 0.0
        max_diff = max(max_diff, diff)
        if not np.all(np.abs(a64 - b64) <= atol + rtol * np.abs(b64)):
            raise TrainingError(f"the exported model's output {name} differs from the dygraph model's by up to {diff:.3g} "
                                f"(rtol={rtol:g}, atol={atol:g}): the export was not published; check for code paths "
                                "paddle.jit cannot convert (Python-side randomness or state), or loosen the tolerance")
    model_file, _ = model_files(tmp)
    result = ExportResult(path=tmp, model_file=model_file, params_file=os.path.join(tmp, PARAMS_FILE),
                          inputs=[{"name": s.name, "shape": [-1 if d is None else int(d) for d in s.shape],
                                   "dtype": str(s.dtype).replace("paddle.", "")} for s, _ in specs],
                          outputs=[{"name": n, "key": k, "shape": [-1] + list(a.shape[1:]), "dtype": str(a.dtype)}
                                   for n, k, a in zip(fetch_names, keys, got)],
                          max_abs_diff=max_diff, rtol=rtol, atol=atol, device=device,
                          sample_rows=int(specs[0][1].shape[0]) if specs and len(specs[0][1].shape) else 1)
    report = asdict(result)
    report.update(model_file=os.path.basename(model_file), params_file=PARAMS_FILE)
    report.pop("path")
    with open(os.path.join(tmp, REPORT_FILE), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    return result


def _publish(tmp: str, final: str) -> None:
    if os.path.exists(final):
        old = f"{final}.old-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)


def export_for_trainer(trainer, path: Optional[str] = None, input_spec: Optional[Sequence[Any]] = None,
                       sample_batch: Any = None, rtol: Optional[float] = None,
                       atol: Optional[float] = None) -> Optional[ExportResult]:
    """Export ``trainer.model`` (see the module docstring); None on ranks other than 0, which write nothing.

    A run whose parameters live in slices (sharding stage 3: each rank holds a range of them, and paddle's
    hooks gather them in every forward, a collective) is refused in one line: export its final checkpoint
    on one process (``trainer.checkpoint.load.load_weights``), which puts the shards together.

    A tensor- or pipeline-parallel run exports one single-card model: every rank must call this, and the
    layout puts its ranks' parts together on rank 0 (:meth:`trainer.layout.Layout.whole_model`: the slices of
    the split parameters gathered over the tensor-parallel group, or every stage's weights, loaded into the
    model's ``single_card_model()``), which exports that."""
    path = path or os.path.join(trainer.args.output_dir, "inference")
    model = trainer.layout.whole_model(trainer.model)  # the ranks' parts put together on rank 0 (a collective)
    if not dist.is_main_process():
        return None
    if input_spec is not None:
        input_spec = list(input_spec)
        batch = sample_batch if sample_batch is not None else _sample_batch_or_none(trainer)
        values, names = split_batch(model, batch) if batch is not None else (None, None)
        if values is not None and not _fits(values, input_spec):
            values = None  # the data does not line up with the given spec: check on synthetic inputs
    else:
        batch = sample_batch if sample_batch is not None else _sample_batch(trainer)
        values, names = split_batch(model, batch)
    result = export_model(model, path, input_spec=input_spec, sample_inputs=values, input_names=names, rtol=rtol, atol=atol)
    logger.info("exported the inference model to %s (%s, %s); paddle.inference matches the dygraph model "
                "within %.3g (max abs diff)", result.path, os.path.basename(result.model_file), PARAMS_FILE,
                result.max_abs_diff)
    return result


def _fits(values: Sequence[Any], input_spec: Sequence[Any]) -> bool:
    """Whether sample values match the spec in number and, for tensors, dtype (a dataset may give
    uint8 pixels that the model normalizes itself while the export takes normalized float32)."""
    if len(values) != len(input_spec):
        return False
    for value, spec in zip(values, input_spec):
        if isinstance(spec, InputSpec) and hasattr(value, "dtype"):
            if str(value.dtype).replace("paddle.", "") != str(spec.dtype).replace("paddle.", ""):
                return False
    return True


def _sample_batch_or_none(trainer):
    try:
        return _sample_batch(trainer)
    except (ConfigError, DataError):
        return None


def export_inference_model(trainer, path: Optional[str] = None, input_spec: Optional[Sequence[Any]] = None,
                           sample_batch: Any = None) -> str:
    """Export and check ``trainer.model``; return the export directory (``Trainer.export`` calls this).

    Only the main process writes; other ranks return the same path at once.
    """
    result = export_for_trainer(trainer, path, input_spec=input_spec, sample_batch=sample_batch)
    return result.path if result is not None else os.path.abspath(path or os.path.join(trainer.args.output_dir, "inference"))
