"""``ptrain predict resnet50 --model RUN/inference IMAGE...``: classify image files
with an exported model (``paddle.inference``), preprocessed as at evaluation
(``preprocess.json``: resize the shorter side, center crop, normalize)."""

from __future__ import annotations

import json
import os
from typing import List

import numpy as np

from trainer.errors import ConfigError, DataError
from trainer.export import create_predictor, model_files, run_predictor

from .imagefolder import read_rgb
from .task_callbacks import PREPROCESS_FILE
from .transforms import ToCHW, eval_transform


def predict(model_dir: str, inputs: List[str]) -> List[dict]:
    """Classify image files with an exported model and its ``preprocess.json``."""
    model_files(model_dir)  # a clear error before any image is read
    path = os.path.join(model_dir, PREPROCESS_FILE)
    if not os.path.isfile(path):
        raise ConfigError(f"{path} does not exist: give the inference/ directory of a finished resnet run")
    with open(path, encoding="utf-8") as f:
        pre = json.load(f)
    transform = eval_transform(pre["image_size"], pre["resize_size"])
    transform.transforms[-1] = ToCHW(pre["mean"], pre["std"])
    batch = []
    for item in inputs:
        if not os.path.isfile(item):
            raise DataError(f"image {item} does not exist: give image file paths")
        batch.append(transform(read_rgb(item, hint="give a PNG, JPEG or other image PIL reads")))
    logits = _run_inference_model(model_dir, np.stack(batch))
    probs = _softmax(logits)
    names = pre["class_names"]
    rows = []
    for item, p in zip(inputs, probs):
        top = np.argsort(-p)[:5]
        rows.append({"input": item, "label": names[int(top[0])], "score": round(float(p[top[0]]), 6),
                     "top5": [[names[int(i)], round(float(p[i]), 6)] for i in top]})
    return rows


def _run_inference_model(model_dir: str, images: np.ndarray) -> np.ndarray:
    predictor = create_predictor(model_dir)
    return run_predictor(predictor, [images.astype("float32")])[0]


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)
