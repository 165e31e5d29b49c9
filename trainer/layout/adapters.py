"""A PEFT adapter around a model (PaddleFormers' or PaddleNLP's ``LoRAModel``): what it is, its state, its merge.

A ``LoRAModel`` wraps the base model (``lora_model.model``) and replaces the target layers by LoRA layers: the
base weight ``W`` frozen beside two trainable matrices ``lora_A`` (in x r) and ``lora_B`` (r x out), the layer
computing ``x @ W + (x @ lora_A @ lora_B) * scaling``. Three questions the rest of the house asks about one:

- :func:`describe`: plain JSON for a checkpoint's ``trainer.json`` (``ptrain inspect`` prints it): the kind, rank,
  alpha, scaling, dropout, target patterns, how many layers carry the adapter, trainable and total parameters;
  None for a model without an adapter.
- :func:`set_state`: a checkpoint's tensors put into the model under the names ``model.state_dict()`` gives. A
  ``LoRAModel``'s own ``set_state_dict`` takes its *inner* model's names (what its ``save_pretrained`` writes)
  and silently skips every other key, so a resume through it would restore nothing: the state goes to the inner
  model, the wrapper's prefix taken off (through the inner model's own ``set_state_dict``, which knows its
  pipeline names), and a key it does not take is an error, never skipped.
- :func:`merged`: the base model with the adapter merged in, what an export writes (``Layout.whole_model``): a
  twin of the inner model whose LoRA layers are plain ``paddle.nn.Linear`` layers holding ``W + lora_A @ lora_B *
  scaling``. The twin shares every other tensor with the trained model (nothing else is copied, nothing of the
  trained model changes), so the deployed model has the base model's class, names and parameter count.

Nothing here imports paddleformers or paddlenlp: an adapter is recognised by what it has (``lora_config``, an
inner ``model``, layers holding ``lora_A``/``lora_B``).
"""

from __future__ import annotations

import copy
import math
from typing import Optional

from ..errors import ConfigError, DataError

PREFIX = "model."  # a LoRAModel's state_dict names: its inner model's, under the attribute ``model``


def is_adapter(model) -> bool:
    """Whether ``model`` is a LoRA wrapper (PaddleFormers' or PaddleNLP's ``LoRAModel``, or one built like it)."""
    inner = getattr(model, "__dict__", {}).get("_sub_layers", {}).get("model")
    return inner is not None and getattr(model, "lora_config", None) is not None and any(
        _is_lora_layer(layer) for layer in inner.sublayers())


def _is_lora_layer(layer) -> bool:
    names = getattr(layer, "_parameters", {})
    return "lora_A" in names and "lora_B" in names


def _lora_layers(inner) -> list:
    return [(name, layer) for name, layer in inner.named_sublayers() if _is_lora_layer(layer)]


def describe(model) -> Optional[dict]:
    """The adapter of ``model`` as plain JSON, or None when it has none (shapes only: no tensor is read)."""
    if not is_adapter(model):
        return None
    config = model.lora_config
    params = list(model.parameters())
    targets = config.target_modules
    return {
        "type": "LoRA",
        "class": f"{type(model).__module__}.{type(model).__name__}",
        "r": int(config.r),
        "lora_alpha": config.lora_alpha,
        "scaling": float(config.scaling) if hasattr(config, "scaling") else config.lora_alpha / config.r,
        "lora_dropout": float(getattr(config, "lora_dropout", 0.0) or 0.0),
        "rslora": bool(getattr(config, "rslora", False)),
        "target_modules": [targets] if isinstance(targets, str) else list(targets or []),
        "adapted_layers": len(_lora_layers(model.model)),
        "trainable_parameters": sum(math.prod(p.shape) for p in params if not p.stop_gradient),
        "total_parameters": sum(math.prod(p.shape) for p in params),
    }


#: values read from each frozen tensor for :func:`frozen_base`'s fingerprint (evenly spaced over the tensor)
SAMPLE = 256


def frozen_base(model) -> Optional[dict]:
    """An adapter model's frozen base as its checkpoints record it in place of its tensors, or None (no adapter).

    A LoRA run's checkpoint holds what training changes (the adapter's tensors, the buffers, the optimizer's
    state), not the frozen base (~28 GB for a 7B model in float32, read again from the base model's files by the
    script that resumes). What it records of the base: how many tensors and values, a digest of their names,
    shapes and dtypes, and a digest of ``SAMPLE`` evenly spaced values of each, read once per ``fit()`` (one small
    device-to-host copy per tensor) before the layout is applied, so that a resume onto another base (another
    checkpoint of the same architecture) is refused instead of training a mismatched adapter."""
    if not is_adapter(model):
        return None
    import hashlib

    import numpy as np
    import paddle

    names, values, elements = hashlib.blake2b(digest_size=16), hashlib.blake2b(digest_size=16), 0
    frozen = sorted((name, p) for name, p in model.named_parameters() if p.stop_gradient)
    with paddle.no_grad():
        for name, p in frozen:
            shape = [int(d) for d in p.shape]
            names.update(f"{name} {shape} {p.dtype}\n".encode())
            n = math.prod(shape)
            elements += n
            if n:
                sample = p.reshape([-1])[::max(1, n // SAMPLE)][:SAMPLE].astype("float32")
                values.update(np.ascontiguousarray(sample.numpy()).tobytes())
    return {"tensors": len(frozen), "elements": elements, "names": names.hexdigest(), "values": values.hexdigest()}


def frozen_tensor_ids(model) -> set:
    """``id()`` of the frozen parameters an adapter model's checkpoint leaves out (:func:`frozen_base`); empty
    without an adapter."""
    return {id(p) for p in model.parameters() if p.stop_gradient} if is_adapter(model) else set()


def set_state(model, state: dict, may_miss=frozenset()) -> None:
    """Put ``state`` (``model.state_dict()``'s names) into ``model``; an adapter's goes to its inner model.
    ``may_miss``: names ``state`` may leave out (an adapter checkpoint's frozen base, :func:`frozen_base`)."""
    if not is_adapter(model):
        model.set_state_dict(state)
        return
    outside = sorted(k for k in state if not k.startswith(PREFIX))
    if outside:
        raise DataError(f"tensors {outside[:5]} are not under the adapter's inner model ('{PREFIX}...')")
    import warnings

    with warnings.catch_warnings():  # paddle warns once per tensor left out: the frozen base, kept as it is
        if may_miss:
            warnings.simplefilter("ignore")
        result = model.model.set_state_dict({k[len(PREFIX):]: v for k, v in state.items()})
    missing, unexpected = result if isinstance(result, tuple) and len(result) == 2 else ([], [])
    missing = [m for m in missing if PREFIX + m not in may_miss]
    if missing or unexpected:
        raise DataError(f"the adapter's inner model did not take the tensors: missing {list(missing)[:5]}, "
                        f"unexpected {list(unexpected)[:5]}")


def merged(model):
    """The model to deploy: ``model`` itself without an adapter (or None, as given); with one, a twin of the
    base model with each LoRA layer's update merged into its weight (the trained model is left as it is)."""
    if model is None or not is_adapter(model):
        return model
    import paddle

    inner = model.model
    shared = {id(t): t for t in list(inner.parameters()) + list(inner.buffers())}
    twin = copy.deepcopy(inner, memo=dict(shared))  # the layers again, every tensor shared with the trained model
    with paddle.no_grad():
        for name, layer in _lora_layers(twin):
            if not isinstance(layer, paddle.nn.Linear) or len(layer.weight.shape) != 2:
                raise ConfigError(f"export: {name} is a {type(layer).__name__}; merging LoRA into the base model is "
                                  "implemented for LoRA on Linear layers: save the adapter with save_model() instead")
            plain = paddle.nn.Linear(layer.weight.shape[0], layer.weight.shape[1],
                                     bias_attr=False if layer.bias is None else None)
            plain.weight.set_value((layer.weight + layer.lora_A @ layer.lora_B * layer.scaling).astype(plain.weight.dtype))
            if layer.bias is not None:
                plain.bias = layer.bias
            plain.weight.stop_gradient = True
            parent = twin
            *path, leaf = name.split(".")
            for part in path:
                parent = getattr(parent, part)
            setattr(parent, leaf, plain)
    twin.eval()
    return twin
