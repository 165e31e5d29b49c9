"""``ptrain predict resnet50 --model RUN/inference IMAGE...``: classify image files
with an exported model (``paddle.inference``), preprocessed as at evaluation
(``preprocess.json``: resize the shorter side, center crop, normalize).

What the model expects (see :func:`predict`): for the digits demo, a white
digit on a black background filling most of the frame, as in scikit-learn's
8x8 scans it learned from; a dark digit on white paper must be inverted first
(``predict`` warns when an image's mean brightness says it was not).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import logging
import os
from typing import List

import numpy as np

from trainer.errors import ConfigError, DataError
from trainer.deploy.predictor import create_predictor, model_files, run_predictor
from trainer.task import Preprocessing

from .imagefolder import read_rgb
from .task_callbacks import PREPROCESS_FILE
from .transforms import ToCHW, eval_transform

logger = logging.getLogger("models.resnet")


INVERTED_MEAN = 0.5  # digits: a white-on-black digit image is mostly black; a mean above half is paper


def _load_preprocess(model_dir: str) -> tuple:
    """``(preprocess.json as a dict, the eval transform it describes)``."""
    model_files(model_dir)  # a clear error before any image is read
    path = os.path.join(model_dir, PREPROCESS_FILE)
    if not os.path.isfile(path):
        raise ConfigError(f"{path} does not exist: give the inference/ directory of a finished resnet run")
    with open(path, encoding="utf-8") as f:
        pre = json.load(f)
    transform = eval_transform(pre["image_size"], pre["resize_size"])
    transform.transforms[-1] = ToCHW(pre["mean"], pre["std"])
    return pre, transform


def _rows(inputs: List, logits: np.ndarray, names: List[str]) -> List[dict]:
    probs = _softmax(logits)
    rows = []
    for item, p in zip(inputs, probs):
        top = np.argsort(-p)[:5]
        rows.append({"input": item, "label": names[int(top[0])], "score": round(float(p[top[0]]), 6),
                     "top5": [[names[int(i)], round(float(p[i]), 6)] for i in top]})
    return rows


def predict(model_dir: str, inputs: List[str]) -> List[dict]:
    """Image files (PNG, JPEG, anything PIL reads), converted to RGB, the shorter side
    resized and the center cropped to the run's input size, normalized with ImageNet's
    mean and std (all from the run's ``preprocess.json``). A model trained on the
    embedded digits expects a white digit on a black background filling most of the
    frame, as in scikit-learn's 8x8 scans: invert a dark digit on white paper first
    (``predict`` warns when an image's mean brightness is above 50%, i.e. looks inverted)."""
    pre, transform = _load_preprocess(model_dir)
    batch = []
    for item in inputs:
        if not os.path.isfile(item):
            raise DataError(f"image {item} does not exist: give image file paths")
        image = read_rgb(item, hint="give a PNG, JPEG or other image PIL reads")
        if pre.get("dataset") == "digits":
            check_digit_polarity(image, item)
        batch.append(transform(image))
    logits = _run_inference_model(model_dir, np.stack(batch))
    return _rows(inputs, logits, pre["class_names"])


def preprocessing(model_dir: str) -> Preprocessing:
    """``ptrain serve``: ``{"images": [base64 image file, ...]}`` -> the rows ``ptrain predict`` prints
    (``"input"`` is the image's index in the request)."""
    pre, transform = _load_preprocess(model_dir)

    def file_bytes(i: int, item) -> bytes:
        if not isinstance(item, str):
            raise DataError(f"item {i}: expected a base64 string of an image file, got {type(item).__name__}")
        try:
            return base64.b64decode(item, validate=True)
        except (binascii.Error, ValueError):
            raise DataError(f"item {i}: not valid base64 (encode the image file's bytes, e.g. base64 -w0 "
                            "digit.png)") from None

    from PIL import Image

    # the server bounds decoded pixels itself, from sizes() (--max_image_pixels, 413), before anything is decoded:
    # PIL's own decompression-bomb check would answer a large image with a warning or an unnamed limit instead
    Image.MAX_IMAGE_PIXELS = None

    def sizes(items: List) -> List[tuple]:
        """Each image's (width, height) from its header: nothing is decoded."""
        out = []
        for i, item in enumerate(items):
            try:
                with Image.open(io.BytesIO(file_bytes(i, item))) as image:
                    out.append(image.size)
            except (OSError, ValueError, SyntaxError) as exc:
                if isinstance(exc, DataError):
                    raise
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise DataError(f"item {i}: cannot be decoded as an image ({reason}): send a PNG, JPEG or other "
                                "file PIL reads") from None
        return out

    def encode(items: List) -> List[np.ndarray]:
        batch = []
        for i, item in enumerate(items):
            data = file_bytes(i, item)
            try:
                image = read_rgb(io.BytesIO(data), hint="send a PNG, JPEG or other image PIL reads")
            except DataError as exc:
                reason = getattr(exc, "reason", None) or "unreadable"
                raise DataError(f"item {i}: cannot be decoded as an image ({reason}): send a PNG, JPEG or other "
                                "file PIL reads") from None
            if pre.get("dataset") == "digits":
                check_digit_polarity(image, f"images[{i}]")
            batch.append(transform(image))
        return [np.stack(batch).astype("float32")]

    def decode(outputs: List[np.ndarray], items: List) -> List[dict]:
        return _rows(list(range(len(items))), outputs[0], pre["class_names"])

    return Preprocessing(field="images", description="base64-encoded image files (PNG, JPEG, ...)",
                         encode=encode, decode=decode, sizes=sizes)


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
