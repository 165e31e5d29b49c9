"""The ResNet task's own callbacks: ``SavePreprocess`` (what ``ptrain predict``
needs, next to the exported model) and ``BadImages`` (unreadable image files)."""

from __future__ import annotations

import json
import logging
import os

from callbacks.base import Callback
from trainer import distributed as dist
from trainer.errors import DataError

from .imagefolder import MAX_CONSECUTIVE_BAD, BadImageError

logger = logging.getLogger("models.resnet")

PREPROCESS_FILE = "preprocess.json"


class SavePreprocess(Callback):
    """Writes ``OUTPUT_DIR/inference/preprocess.json`` (input size, resize, mean/std,
    class names) for ``ptrain predict``.

    Events: fit_end (rank 0, when the run completed or stopped, as Export; after ``callbacks.Export``,
    which replaces the whole directory).
    Options: ``output_dir``, ``preprocess`` (a dict). State: none.
    """

    order = 310  # after Export (300)

    def __init__(self, output_dir: str, preprocess: dict):
        self.output_dir, self.preprocess = output_dir, dict(preprocess)

    def on_fit_end(self, trainer):
        if trainer.state.status not in ("completed", "stopped") or not trainer.is_main_process:
            return  # as callbacks.Export: no model, no preprocess.json
        folder = os.path.join(self.output_dir, "inference")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, PREPROCESS_FILE), "w", encoding="utf-8") as f:
            json.dump({"task": "resnet50", **self.preprocess}, f, indent=1)  # "task": what ptrain serve loads


class BadImages(Callback):
    """Acts on the unreadable image files the ImageFolder datasets marked (see
    ``models.resnet.imagefolder``): with ``bad_images='fail'`` raises
    ``BadImageError`` naming the first one in the main process; at the end of
    fit, sums them over ranks into the run's info (``bad_images_skipped`` in
    results.json).

    Events: step_end, eval_end, predict_end (one shared byte read when all is
    well, no device sync; also stops either mode when a whole run of files is
    unreadable); fit_end (every rank joins the sum; not when the run failed).
    Options: the datasets, the mode, the info dict. State: none.
    """

    order = 150

    def __init__(self, datasets, mode: str, info: dict):
        self.datasets = list({id(d): d for d in datasets}.values())
        self.mode, self.info = mode, info

    def _check(self):
        for d in self.datasets:
            if not d.has_bad():
                continue
            if d.broken():
                raise DataError(f"{MAX_CONSECUTIVE_BAD} images in a row under {d.root} cannot be read "
                                f"(first: {d.bad_paths()[0]}): check the data directory")
            if self.mode == "fail":
                path = d.bad_paths()[0]
                raise BadImageError(f"image {path} cannot be read (the warning above says why): replace or "
                                    "delete the file, or pass --bad_images skip", path=path)

    def on_step_end(self, trainer):
        self._check()

    def on_eval_end(self, trainer):
        self._check()

    def on_predict_end(self, trainer):
        self._check()

    def on_fit_end(self, trainer):
        if trainer.state.status == "failed":
            return
        local = sum(len(d.bad_paths()) for d in self.datasets)
        total = int(dist.reduce_scalars([local], op="sum")[0]) if dist.get_world_size() > 1 else local
        self.info["bad_images_skipped"] = total
        if total and trainer.is_main_process:
            logger.warning("%d unreadable image file(s) were skipped (their paths are in the warnings above)", total)
