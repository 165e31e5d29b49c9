"""The runtimes a served model runs on: ``paddle.inference`` or ``onnxruntime``, behind one interface.

Each runtime is loaded in a predictor worker process (``trainer.deploy.worker``)
and offers ``inputs`` (``[{"name", "shape", "dtype"}]``, -1 for a dynamic
dimension), ``outputs`` (names) and ``run(arrays) -> [arrays]`` (inputs in the
order of ``inputs``). ``load_runtime(name, model_dir, ...)`` picks one.
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

import numpy as np

from ..errors import ConfigError, DataError, pip_extra
from .predictor import create_predictor, input_spec, run_predictor

RUNTIMES = ("paddle", "onnxruntime")
ONNX_FILE = "model.onnx"


class PaddleRuntime:
    """An export run by ``paddle.inference`` (the runtime ``ptrain predict`` and the export check use)."""

    name = "paddle"

    def __init__(self, model_dir: str, device: str = "cpu", threads: int = 1, prefix: Optional[str] = None):
        self.predictor = create_predictor(model_dir, device=device, threads=threads, prefix=prefix)
        feed = list(self.predictor.get_input_names())
        known = {s["name"]: s for s in input_spec(model_dir, prefix)}
        self.inputs = [known.get(n) or {"name": n, "shape": None, "dtype": _paddle_dtype(self.predictor, n)}
                       for n in feed]
        self.outputs = list(self.predictor.get_output_names())
        # the handles are the predictor's own and live with it: looked up once, not per call (as paddle's examples do)
        self._feed = [self.predictor.get_input_handle(s["name"]) for s in self.inputs]
        self._fetch = [self.predictor.get_output_handle(n) for n in self.outputs]

    def run(self, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        if len(arrays) != len(self._feed):
            return run_predictor(self.predictor, list(arrays), [s["name"] for s in self.inputs])  # its one line
        for handle, value in zip(self._feed, arrays):
            value = np.ascontiguousarray(value)
            handle.reshape(list(value.shape))
            handle.copy_from_cpu(value)
        self.predictor.run()
        return [handle.copy_to_cpu() for handle in self._fetch]


def _paddle_dtype(predictor, name: str) -> str:
    kind = str(predictor.get_input_handle(name).type()).rsplit(".", 1)[-1].lower()
    return {"float32": "float32", "float64": "float64", "int64": "int64", "int32": "int32", "bool": "bool",
            "float16": "float16", "uint8": "uint8", "int8": "int8"}.get(kind, "float32")


_ONNX_DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(int64)": "int64",
                "tensor(int32)": "int32", "tensor(bool)": "bool", "tensor(float16)": "float16",
                "tensor(uint8)": "uint8", "tensor(int8)": "int8"}


class OnnxRuntime:
    """``MODEL_DIR/model.onnx`` (written by ``trainer.deploy.onnx_export``) run by ``onnxruntime`` on CPU."""

    name = "onnxruntime"

    def __init__(self, model_dir: str, device: str = "cpu", threads: int = 1, prefix: Optional[str] = None):
        try:
            import onnxruntime as ort
        except ImportError:
            raise ConfigError(f"--runtime onnxruntime needs onnxruntime: {pip_extra('onnx')}") from None
        if device != "cpu":
            raise ConfigError(f"--device {device} with --runtime onnxruntime: this build serves ONNX on the CPU only; "
                              "use --device cpu or --runtime paddle")
        path = os.path.join(model_dir, ONNX_FILE)
        if not os.path.isfile(path):
            raise DataError(f"{path} does not exist: convert the export first (trainer.deploy.onnx_export.export_onnx, "
                            "which ptrain serve --runtime onnxruntime runs when the file is missing)")
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, threads)
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        self.inputs = [{"name": i.name, "shape": [d if isinstance(d, int) else -1 for d in i.shape],
                        "dtype": _ONNX_DTYPES.get(i.type, "float32")} for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def run(self, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        feed = {s["name"]: np.ascontiguousarray(a) for s, a in zip(self.inputs, arrays)}
        return list(self.session.run(None, feed))


def load_runtime(name: str, model_dir: str, device: str = "cpu", threads: int = 1, prefix: Optional[str] = None):
    """The runtime ``name`` (one of ``RUNTIMES``) for the export in ``model_dir``."""
    if name == "paddle":
        return PaddleRuntime(model_dir, device, threads, prefix)
    if name == "onnxruntime":
        return OnnxRuntime(model_dir, device, threads, prefix)
    raise ConfigError(f"--runtime {name} is not known: give one of {', '.join(RUNTIMES)}")


def synthetic_batch(inputs: Sequence[dict], rows: int) -> List[np.ndarray]:
    """A ``rows``-row batch matching ``inputs`` (dynamic dims 8; zeros, as token ids 0 are valid), for warm-up."""
    out = []
    for spec in inputs:
        shape = spec["shape"] or [-1]
        dims = [rows if i == 0 else (8 if d < 0 else d) for i, d in enumerate(shape)]
        out.append(np.zeros(dims, dtype=spec["dtype"]))
    return out
