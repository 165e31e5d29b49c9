"""Loading an exported inference model: its files, a ``paddle.inference`` predictor, and one run of it.

::

    predictor = create_predictor("runs/digits/inference")
    (logits,) = run_predictor(predictor, [features])
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

import numpy as np

from ..errors import DataError

PREFIX = "model"
MODEL_FILES = (PREFIX + ".json", PREFIX + ".pdmodel")  # PIR (paddle 3 default), legacy program IR
PARAMS_FILE = PREFIX + ".pdiparams"


def model_files(path: str) -> tuple:
    """``(model_file, params_file)`` of the export in directory ``path``."""
    for name in MODEL_FILES:
        model_file = os.path.join(path, name)
        if os.path.isfile(model_file):
            params_file = os.path.join(path, PARAMS_FILE)
            if not os.path.isfile(params_file):
                raise DataError(f"{path} has {name} but no {PARAMS_FILE}: the export is incomplete, export again")
            return model_file, params_file
    raise DataError(f"{path} holds no inference model ({' or '.join(MODEL_FILES)}): give the directory "
                    "Trainer.export() or callbacks.Export wrote (output_dir/inference)")


def create_predictor(path: str, device: str = "cpu", threads: int = 1):
    """A ``paddle.inference`` predictor for the export in ``path`` (device ``cpu`` or ``gpu:N``)."""
    import paddle.inference as paddle_infer

    model_file, params_file = model_files(path)
    config = paddle_infer.Config(model_file, params_file)
    if device.startswith("gpu"):
        config.enable_use_gpu(256, int(device.partition(":")[2] or 0))
    else:
        config.disable_gpu()
        config.set_cpu_math_library_num_threads(threads)
    config.disable_glog_info()
    return paddle_infer.create_predictor(config)


def run_predictor(predictor, inputs: Sequence[np.ndarray], names: Optional[Sequence[str]] = None) -> List[np.ndarray]:
    """Feed ``inputs`` (matched by ``names``, else in the predictor's input order); return every output."""
    feed_names = list(predictor.get_input_names())
    names = list(names) if names is not None else feed_names[:len(inputs)]
    if len(inputs) != len(feed_names) or sorted(names) != sorted(feed_names):
        raise DataError(f"the inference model takes inputs {feed_names}, got {len(inputs)} named {names}")
    for name, value in zip(names, inputs):
        value = np.ascontiguousarray(value)
        handle = predictor.get_input_handle(name)
        handle.reshape(list(value.shape))
        handle.copy_from_cpu(value)
    predictor.run()
    return [predictor.get_output_handle(n).copy_to_cpu() for n in predictor.get_output_names()]
