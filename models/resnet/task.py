"""The ResNet task: options, model, data and metrics, registered as
``ptrain run resnet50`` (and ``resnet``); ``--depth 18|34|50|101|152`` picks the network.

    ptrain run resnet50                                   # demo: ResNet-50 on the embedded digits, CPU
    ptrain run resnet --recipe demo18                     # the faster demo: ResNet-18
    ptrain run resnet50 --recipe imagenet --data_dir /data/imagenet --gpus 0,1,2,3
    ptrain predict resnet50 --model runs/resnet-demo/inference digit.png
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import paddle
from paddle.static import InputSpec

from callbacks.base import Callback
from callbacks.export import Export
from trainer.errors import ConfigError
from trainer.task import Task, TaskRun

from .task_callbacks import BadImages, SavePreprocess
from .data import build_datasets, class_names, preprocess_for
from .imagefolder import BAD_IMAGE_CHOICES, MAX_IMAGE_PIXELS
from .metrics import metrics_fn
from .model import DEPTHS, build_resnet, load_pretrained
from .predict import predict, preprocessing

DATASETS = ("auto", "digits", "imagefolder", "cifar10")
DATA_BACKENDS = ("turbo", "pillow", "dali")


@dataclass
class ResNetOptions:
    """Task options (``--name value`` on the command line, ``task:`` in a recipe;
    ``ptrain`` coerces command-line strings to the annotated types first)."""

    depth: int = 50                       # 18 | 34 | 50 | 101 | 152
    dataset: str = "auto"                 # digits (embedded) | imagefolder | cifar10; auto: imagefolder when data_dir is set
    data_dir: Optional[str] = None        # imagefolder: holds train/ and val/ (test/ optional); cifar10: the archive or its folder
    image_size: int = 0                   # network input; 0: 224 for imagefolder, 32 otherwise
    resize_size: int = 0                  # eval: shorter side before the center crop; 0: image_size * 256 / 224
    augment: bool = True                  # training augmentation (imagefolder: RandomResizedCrop + flip; arrays: shifts)
    zero_init_residual: bool = False      # gamma = 0 in the last BatchNorm of each residual block
    label_smoothing: float = 0.0          # of the cross-entropy loss
    pretrained: Optional[str] = None      # a .safetensors / .pdparams file, or 'imagenet' (paddle's cache or download)
    data_backend: str = "turbo"           # imagefolder decoding: turbo (libjpeg-turbo + OpenCV; Pillow for non-JPEG) | pillow | dali
    bad_images: str = "skip"              # unreadable image files: skip (log, count, use the next image) | fail
    max_image_pixels: int = MAX_IMAGE_PIXELS  # an image whose header says more pixels is a bad image (never decoded); 0: no limit
    val_fraction: float = 0.1             # digits and cifar10: share held out for validation
    test_fraction: float = 0.2            # digits: share held out for the test
    split_seed: int = 0                   # seed of the stratified split

    def __post_init__(self):
        if self.depth not in DEPTHS:
            raise ConfigError(f"depth={self.depth!r} is not allowed: choose one of {', '.join(map(str, DEPTHS))}")
        if self.dataset not in DATASETS:
            raise ConfigError(f"dataset={self.dataset!r} is not allowed: choose one of {', '.join(DATASETS)}")
        if self.dataset == "auto":
            self.dataset = "imagefolder" if self.data_dir else "digits"
        if self.dataset == "imagefolder":
            if not self.data_dir:
                raise ConfigError("dataset=imagefolder needs --data_dir DIR (a folder holding train/ and val/, one sub-folder per class)")
            if not os.path.isdir(self.data_dir):
                raise ConfigError(f"data_dir={self.data_dir!r} is not a directory: give the folder holding train/ and val/")
        elif self.dataset == "digits" and self.data_dir:
            raise ConfigError("data_dir is set but dataset=digits is embedded: drop --data_dir or pass --dataset imagefolder")
        if self.image_size == 0:
            self.image_size = 224 if self.dataset == "imagefolder" else 32
        if self.image_size < 16:
            raise ConfigError(f"image_size={self.image_size} is not allowed: image_size must be >= 16 (0 = the dataset's default)")
        if self.resize_size == 0:
            self.resize_size = int(round(self.image_size * 256 / 224)) if self.dataset == "imagefolder" else self.image_size
        if self.resize_size < self.image_size:
            raise ConfigError(f"resize_size={self.resize_size} is not allowed: resize_size must be >= image_size ({self.image_size})")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"label_smoothing={self.label_smoothing!r} is not allowed: label_smoothing must be in [0, 1)")
        if self.data_backend not in DATA_BACKENDS:
            raise ConfigError(f"data_backend={self.data_backend!r} is not allowed: choose one of {', '.join(DATA_BACKENDS)}")
        if self.data_backend == "dali":
            if self.dataset != "imagefolder":
                raise ConfigError(f"data_backend=dali reads image files: it needs --dataset imagefolder (--data_dir DIR), "
                                  f"not {self.dataset}")
            from .dali import dali_missing

            missing = dali_missing()
            if missing:
                raise ConfigError(f"data_backend=dali needs NVIDIA DALI ({missing}): pip install '.[dali]' "
                                  "(nvidia-dali-cuda120), or use --data_backend turbo")
        if self.bad_images not in BAD_IMAGE_CHOICES:
            raise ConfigError(f"bad_images={self.bad_images!r} is not allowed: choose skip or fail")
        if self.max_image_pixels < 0:
            raise ConfigError(f"max_image_pixels={self.max_image_pixels} is not allowed: give a pixel count "
                              f"(default {MAX_IMAGE_PIXELS}, Pillow's limit), or 0 for no limit")
        if self.pretrained and self.pretrained != "imagenet" and not os.path.isfile(self.pretrained):
            raise ConfigError(f"pretrained={self.pretrained!r}: no such file; give a .safetensors or .pdparams path, or imagenet")
        if not (0 < self.val_fraction < 1 and 0 <= self.test_fraction < 1 and self.val_fraction + self.test_fraction < 0.9):
            raise ConfigError(f"val_fraction={self.val_fraction}, test_fraction={self.test_fraction} are not allowed: "
                              "each in (0, 1) and together below 0.9")


def build(options: ResNetOptions, args) -> TaskRun:
    if options.data_backend == "dali" and args.dataloader_num_workers > 0:
        raise ConfigError(f"--data_backend dali decodes in DALI's own threads: set --dataloader_num_workers 0 "
                          f"(it is {args.dataloader_num_workers})")
    data = build_datasets(options)
    run = _model_run(options, args, data.class_names, data.preprocess)
    run.info.update({"train_samples": len(data.train), "eval_samples": len(data.val),
                     "test_samples": len(data.test), **data.info})
    if options.pretrained:
        run.info.update(load_pretrained(run.model, options.pretrained, options.depth))
    datasets = [d for d in (data.train, data.val, data.test) if hasattr(d, "has_bad")]
    if datasets:
        run.callbacks.append(BadImages(datasets, options.bad_images, run.info))
    run.train_dataset, run.eval_dataset, run.test_dataset = data.train, data.val, data.test
    return run


def dry_build(options: ResNetOptions, args) -> TaskRun:
    """The run without its data (``ptrain run resnet50 --dry_run``): the class names come from
    the folder names (or the dataset's fixed classes), no image is read, no weights are loaded."""
    names = class_names(options)
    run = _model_run(options, args, names, preprocess_for(options, names))
    if options.pretrained:
        run.info["pretrained"] = f"{options.pretrained} (not loaded for a dry run)"
    return run


def _model_run(options: ResNetOptions, args, names: List[str], preprocess: dict) -> TaskRun:
    """The model, loss, metrics, export callbacks and info of a run over ``names`` classes."""
    paddle.seed(args.seed)  # the initial weights follow the run's seed
    model = build_resnet(options.depth, len(names), options.zero_init_residual)
    trainable = sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient)
    # results.json's "task": the family (resnet50 is its other name); the network is "model"
    info = {"task": "resnet", "model": f"resnet{options.depth}", "dataset": options.dataset, "depth": options.depth,
            "image_size": options.image_size, "num_classes": len(names), "parameters": trainable}
    spec = [InputSpec([None, 3, options.image_size, options.image_size], "float32", "image")]
    callbacks: List[Callback] = [Export(input_spec=spec, rtol=1e-4, atol=1e-4), SavePreprocess(args.output_dir, preprocess)]
    loss = paddle.nn.CrossEntropyLoss(label_smoothing=options.label_smoothing)
    return TaskRun(model=model, loss_fn=loss, compute_metrics=metrics_fn(5), callbacks=callbacks, info=info)


TASK = Task(
    name="resnet50",
    description="ResNet-18/34/50/101/152 image classification (paddle.vision); demo: ResNet-50 on the embedded "
                "digits (recipe demo18: ResNet-18), ImageNet recipes",
    options_class=ResNetOptions,
    build=build,
    dry_build=dry_build,
    recipes_dir=os.path.join(os.path.dirname(__file__), "recipes"),
    predict=predict,
    preprocessing=preprocessing,
    resume_may_change={"pretrained": "the initial weights only: a resume replaces them with the checkpoint's"},
    output_names=("logits",),
)
