"""ResNet-18/34/50/101/152 from ``paddle.vision.models`` (v1.5: the stride-2
convolution of a bottleneck is its 3x3), with the two tricks of the large-batch
recipe and local pretrained weights.

* ``zero_init_residual``: the last BatchNorm of every residual block starts
  with gamma = 0, so each block starts as the identity (Goyal et al., 2017).
* Weight decay never touches BatchNorm gamma/beta or biases: the Trainer's
  default optimizer decays only parameters with 2+ dimensions (conv kernels and
  the fc matrix); ``decay_parameter_names`` lists them for tests and reports.
* ``load_pretrained(model, source)``: a local ``.safetensors`` file (plain
  tensors; preferred) or ``.pdparams`` file (read with ``paddle.load``, which
  unpickles: only load files you trust), or ``imagenet`` for paddle's published
  weights, used from paddle's cache or downloaded when the server answers; an
  ``fc`` whose shape does not fit ``num_classes`` is left freshly initialized.
"""

from __future__ import annotations

import logging
import os
from typing import Dict, List

import numpy as np
import paddle
from paddle.vision.models import resnet as paddle_resnet

from trainer.errors import ConfigError
from trainer.tensors import to_numpy

from .transforms import normalize_pixels

logger = logging.getLogger("models.resnet")

DEPTHS = (18, 34, 50, 101, 152)
PRETRAINED_NAMES = ("imagenet",)


class ResNet(paddle_resnet.ResNet):
    """paddle.vision's ResNet (same layers, same state_dict) that also takes uint8 NCHW pixels,
    normalized on the device with the ImageNet statistics; float32 input is taken as normalized."""

    def forward(self, x):
        if x.dtype == paddle.uint8:
            x = normalize_pixels(x)
        return super().forward(x)


def build_resnet(depth: int = 50, num_classes: int = 1000, zero_init_residual: bool = False) -> paddle.nn.Layer:
    """``paddle.vision.models.resnet{depth}(num_classes=...)`` as :class:`ResNet`, optionally
    zero-initialized residual branches."""
    if depth not in DEPTHS:
        raise ConfigError(f"depth={depth!r} is not allowed: choose one of {', '.join(map(str, DEPTHS))}")
    block = paddle_resnet.BasicBlock if depth < 50 else paddle_resnet.BottleneckBlock
    model = ResNet(block, depth, num_classes=num_classes)
    if zero_init_residual:
        for norm in last_block_norms(model):
            norm.weight.set_value(paddle.zeros_like(norm.weight))
    return model


def last_block_norms(model: paddle.nn.Layer) -> List[paddle.nn.Layer]:
    """The BatchNorm closing the residual branch of each block (bn2 of a basic block, bn3 of a bottleneck)."""
    out = []
    for layer in model.sublayers():
        if isinstance(layer, paddle_resnet.BottleneckBlock):
            out.append(layer.bn3)
        elif isinstance(layer, paddle_resnet.BasicBlock):
            out.append(layer.bn2)
    return out


def decay_parameter_names(model: paddle.nn.Layer) -> List[str]:
    """Structured names of the parameters the Trainer's default optimizer decays (trainable, ndim >= 2)."""
    return [name for name, p in model.named_parameters() if p.ndim >= 2 and not p.stop_gradient]


def load_pretrained(model: paddle.nn.Layer, source: str, depth: int) -> Dict[str, int]:
    """Load weights into ``model`` from a file or a published name; returns counts
    of loaded and re-initialized tensors. Errors are one-line ConfigErrors."""
    path = _resolve_pretrained(source, depth)
    weights = _read_weights(path)
    own = model.state_dict()
    weights = _strip_prefix(weights, set(own))
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    if unexpected or [k for k in missing if not k.startswith("fc.")]:
        example = (unexpected or missing)[0]
        raise ConfigError(f"--pretrained {source}: {len(missing)} tensors missing and {len(unexpected)} unexpected "
                          f"(e.g. '{example}'): is it a ResNet-{depth} state dict?")
    loaded, skipped = {}, []
    for key, value in weights.items():
        if tuple(value.shape) != tuple(own[key].shape):
            if key.startswith("fc."):
                skipped.append(key)
                continue
            raise ConfigError(f"--pretrained {source}: '{key}' has shape {list(value.shape)}, the model needs "
                              f"{list(own[key].shape)}: is it a ResNet-{depth}?")
        loaded[key] = paddle.to_tensor(np.asarray(value), dtype=own[key].dtype)
    model.set_state_dict(loaded)
    if skipped or missing:
        logger.info("pretrained %s: the classifier (fc) does not fit %d classes and starts fresh",
                    source, own["fc.weight"].shape[1])
    return {"pretrained_tensors": len(loaded), "reinitialized_tensors": len(set(skipped) | set(missing))}


def _resolve_pretrained(source: str, depth: int) -> str:
    if os.path.isfile(source):
        return source
    if source not in PRETRAINED_NAMES:
        raise ConfigError(f"--pretrained {source}: no such file; give a .safetensors or .pdparams path, "
                          f"or one of {', '.join(PRETRAINED_NAMES)}")
    from paddle.utils.download import WEIGHTS_HOME, get_weights_path_from_url

    from .data import reachable

    arch = f"resnet{depth}"
    if arch not in paddle_resnet.model_urls:
        raise ConfigError(f"--pretrained {source}: paddle publishes no ImageNet weights for {arch}")
    url, md5 = paddle_resnet.model_urls[arch]
    cached = os.path.join(WEIGHTS_HOME, os.path.basename(url))
    if os.path.isfile(cached):
        return cached
    from urllib.parse import urlparse

    if not reachable(urlparse(url).hostname):
        raise ConfigError(f"--pretrained {source}: {arch} weights are not in {cached} and {url} cannot be reached "
                          "(offline?): download the file elsewhere and pass --pretrained PATH")
    return get_weights_path_from_url(url, md5)


def _read_weights(path: str) -> Dict[str, np.ndarray]:
    try:
        if path.endswith(".safetensors"):
            from safetensors.numpy import load_file

            return dict(load_file(path))
        state = paddle.load(path)  # pickle-based: only for files you trust
    except Exception as exc:  # noqa: BLE001 - any reader error: name the file
        raise ConfigError(f"--pretrained {path} cannot be read ({type(exc).__name__}: {exc}): "
                          "give a .safetensors or .pdparams file") from None
    if not isinstance(state, dict):
        raise ConfigError(f"--pretrained {path} holds a {type(state).__name__}, not a state dict")
    return {k: (to_numpy(v) if isinstance(v, paddle.Tensor) else np.asarray(v)) for k, v in state.items()}


def _strip_prefix(weights: Dict[str, np.ndarray], own_keys: set) -> Dict[str, np.ndarray]:
    """Drop a wrapper prefix such as ``model.`` or ``_layers.`` shared by every key."""
    if not weights or set(weights) & own_keys:
        return weights
    for prefix in ("model.", "_layers.", "backbone.", "module."):
        if all(k.startswith(prefix) for k in weights):
            return {k[len(prefix):]: v for k, v in weights.items()}
    return weights
