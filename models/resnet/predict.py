"""``ptrain predict resnet50 --model RUN/inference IMAGE...``: classify image files
with an exported model (``paddle.inference``), preprocessed as at evaluation
(``preprocess.json``: resize the shorter side, center crop, normalize).

What the model expects (see :func:`predict`): for the digits demo, a white
digit on a black background filling most of the frame, as in scikit-learn's
8x8 scans it learned from; a dark digit on white paper must be inverted first
(``predict`` warns when an image's mean brightness says it was not).
"""

from __future__ import annotations

import json
import logging
import os
from typing import List

import numpy as np

from trainer.errors import ConfigError, DataError
from trainer.deploy.predictor import create_predictor, model_files, run_predictor

from .imagefolder import read_rgb
from .task_callbacks import PREPROCESS_FILE
from .transforms import ToCHW, eval_transform

logger = logging.getLogger("models.resnet")


INVERTED_MEAN = 0.5  # digits: a white-on-black digit image is mostly black; a mean above half is paper


def predict(model_dir: str, inputs: List[str]) -> List[dict]:
    """Image files (PNG, JPEG, anything PIL reads), converted to RGB, the shorter side
    resized and the center cropped to the run's input size, normalized with ImageNet's
    mean and std (all from the run's ``preprocess.json``). A model trained on the
    embedded digits expects a white digit on a black background filling most of the
    frame, as in scikit-learn's 8x8 scans: invert a dark digit on white paper first
    (``predict`` warns when an image's mean brightness is above 50%, i.e. looks inverted)."""
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
        image = read_rgb(item, hint="give a PNG, JPEG or other image PIL reads")
        if pre.get("dataset") == "digits":
            check_digit_polarity(image, item)
        batch.append(transform(image))
    logits = _run_inference_model(model_dir, np.stack(batch))
    probs = _softmax(logits)
    names = pre["class_names"]
    rows = []
    for item, p in zip(inputs, probs):
        top = np.argsort(-p)[:5]
        rows.append({"input": item, "label": names[int(top[0])], "score": round(float(p[top[0]]), 6),
                     "top5": [[names[int(i)], round(float(p[i]), 6)] for i in top]})
    return rows


def check_digit_polarity(image, name: str) -> bool:
    """Warn (and return False) when ``image`` looks like a dark digit on a light background."""
    mean = float(np.asarray(image.convert("L"), dtype="float32").mean()) / 255.0
    if mean <= INVERTED_MEAN:
        return True
    logger.warning("%s looks inverted (mean brightness %.0f%%): the digits model expects a white digit on a black "
                   "background, as it was trained; invert the image (e.g. PIL.ImageOps.invert) or the prediction "
                   "is likely wrong", name, 100 * mean)
    return False


def _run_inference_model(model_dir: str, images: np.ndarray) -> np.ndarray:
    predictor = create_predictor(model_dir)
    return run_predictor(predictor, [images.astype("float32")])[0]


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)
