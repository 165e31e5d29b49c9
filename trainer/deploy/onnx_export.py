"""ONNX from the same export: ``paddle2onnx`` converts it, ``onnxruntime`` proves it matches ``paddle.inference``.

::

    from trainer.deploy.onnx_export import export_onnx
    report = export_onnx("runs/digits-demo/inference")   # writes model.onnx and onnx.json
    report["max_abs_diff"]                               # <= 1e-4, or OnnxExportError

``export_onnx(model_dir)`` converts ``PREFIX.json`` (paddle 3's PIR program;
``PREFIX.pdmodel`` of the legacy IR is translated by paddle2onnx) with
``paddle2onnx.export`` (opset 13, ``optimize_tool="none"``: its default,
polygraphy's constant folding, pip-installs onnx_graphsurgeon from a
non-PyPI index at run time, and onnxoptimizer 0.3.13 lacks a pass
paddle2onnx 2.1 asks for; onnxruntime folds constants itself when it loads),
runs ``onnxruntime`` and ``paddle.inference`` on the same sample batch (rows
drawn from a fixed seed, shaped by the export's input spec: dynamic
dimensions 8) and writes ``model.onnx`` only when every output agrees within
``atol`` (default 1e-4, max absolute difference), with ``onnx.json``
(paddle2onnx, onnxruntime versions, opset, the max difference, the batch).
``ptrain serve --runtime onnxruntime`` calls it when ``model.onnx`` is
missing or older than the paddle export.
"""

from __future__ import annotations

import json
import os
from typing import List, Optional

import numpy as np

from ..errors import ConfigError, TrainingError, pip_extra
from .predictor import create_predictor, input_spec, model_files, run_predictor
from .runtimes import ONNX_FILE

REPORT_FILE = "onnx.json"
OPSET = 13
ATOL = 1e-4
SAMPLE_ROWS = 4


class OnnxExportError(TrainingError):
    """paddle2onnx could not convert the export, or onnxruntime disagrees with paddle.inference."""


def sample_batch(specs: List[dict], rows: int = SAMPLE_ROWS, seed: int = 0) -> List[np.ndarray]:
    """A fixed-seed batch for ``specs``: normal floats, integers in [0, 2) (valid token ids and masks)."""
    rng = np.random.RandomState(seed)
    out = []
    for spec in specs:
        dims = [rows if i == 0 else (8 if d < 0 else d) for i, d in enumerate(spec["shape"])]
        dtype = np.dtype(spec["dtype"])
        out.append(rng.randn(*dims).astype(dtype) if dtype.kind == "f" else rng.randint(0, 2, dims).astype(dtype))
    return out


def is_current(model_dir: str, prefix: Optional[str] = None) -> bool:
    """Whether ``model.onnx`` exists and is newer than the paddle export it was made from."""
    onnx_path = os.path.join(model_dir, ONNX_FILE)
    if not os.path.isfile(onnx_path) or not os.path.isfile(os.path.join(model_dir, REPORT_FILE)):
        return False
    return os.path.getmtime(onnx_path) >= max(os.path.getmtime(f) for f in model_files(model_dir, prefix))


def export_onnx(model_dir: str, prefix: Optional[str] = None, atol: float = ATOL, opset: int = OPSET) -> dict:
    """Convert, check and publish ``model_dir/model.onnx``; return the report (also ``onnx.json``)."""
    try:
        import onnxruntime as ort
        import paddle2onnx
    except ImportError as exc:
        raise ConfigError(f"ONNX export needs paddle2onnx and onnxruntime ({exc.name} is missing): "
                          f"{pip_extra('onnx')}") from None
    os.environ.setdefault("POLYGRAPHY_AUTOINSTALL_DEPS", "0")
    model_file, params_file = model_files(model_dir, prefix)
    specs = input_spec(model_dir, prefix)
    if not specs or any(s["shape"] is None for s in specs):
        raise OnnxExportError(f"{model_dir}: the inputs' shapes are unknown (no export.json, not a PIR program): "
                              "export with Trainer.export() first")
    final = os.path.join(model_dir, ONNX_FILE)
    tmp = f"{final}.tmp-{os.getpid()}"
    try:
        try:
            paddle2onnx.export(model_file, params_file, tmp, opset_version=opset, auto_upgrade_opset=True,
                               enable_onnx_checker=True, enable_optimize=False,
                               optimize_tool="none")
        except Exception as exc:  # noqa: BLE001 - paddle2onnx raises plain Exceptions naming the op
            last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1].strip()
            raise OnnxExportError(f"paddle2onnx {paddle2onnx.__version__} cannot convert {model_file}: {last}") from exc
        if not os.path.isfile(tmp):
            raise OnnxExportError(f"paddle2onnx {paddle2onnx.__version__} wrote no ONNX file for {model_file} "
                                  "(an operator it cannot convert: see its log above)")
        batch = sample_batch(specs)
        expected = run_predictor(create_predictor(model_dir, prefix=prefix), batch, [s["name"] for s in specs])
        options = ort.SessionOptions()
        options.log_severity_level = 3  # no warning per unused initializer paddle2onnx leaves
        session = ort.InferenceSession(tmp, sess_options=options, providers=["CPUExecutionProvider"])
        feeds = {i.name for i in session.get_inputs()}
        if feeds != {s["name"] for s in specs}:
            raise OnnxExportError(f"the ONNX model takes inputs {sorted(feeds)}, the paddle export {[s['name'] for s in specs]}")
        got = session.run(None, {s["name"]: a for s, a in zip(specs, batch)})
        if len(got) != len(expected):
            raise OnnxExportError(f"the ONNX model returns {len(got)} outputs, paddle.inference {len(expected)}")
        diffs = []
        for i, (a, b) in enumerate(zip(got, expected)):
            if a.shape != b.shape:
                raise OnnxExportError(f"ONNX output {i} has shape {list(a.shape)}, paddle.inference's {list(b.shape)}")
            diffs.append(float(np.max(np.abs(a.astype("float64") - b.astype("float64")))) if a.size else 0.0)
        max_diff = max(diffs) if diffs else 0.0
        if not max_diff <= atol:
            raise OnnxExportError(f"onnxruntime differs from paddle.inference by up to {max_diff:.3g} on the sample "
                                  f"batch (atol {atol:g}): model.onnx was not written")
        report = {"onnx_file": ONNX_FILE, "from": os.path.basename(model_file), "paddle2onnx": paddle2onnx.__version__,
                  "onnxruntime": ort.__version__, "opset": opset, "max_abs_diff": max_diff, "atol": atol,
                  "sample_rows": SAMPLE_ROWS, "inputs": specs}
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    with open(os.path.join(model_dir, REPORT_FILE), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    return report
