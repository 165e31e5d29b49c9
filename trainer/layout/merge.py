"""The whole weights of a tensor-parallel model, put together from its ranks' slices: what an export merges.

:func:`merged_state_dict` gathers, over the tensor-parallel group, each parameter fleet's parallel layers split
(``is_distributed`` with its ``split_axis``: ``trainer.layout.slices.tensor_parallel_splits``) and joins the
slices along that axis; the other tensors are taken as they are. A collective: every rank of the job calls it.
:func:`single_card_model` gives the model those weights load into: the model's own ``single_card_model()``
(the same architecture with plain layers and whole shapes, e.g. ``models/ernie/parallel_model.py``).
"""

from __future__ import annotations

from typing import Dict

import numpy as np
import paddle
import paddle.distributed as pdist

from ..errors import ConfigError
from ..tensors import to_numpy
from .slices import tensor_parallel_splits


def merged_state_dict(model: paddle.nn.Layer, group) -> Dict[str, np.ndarray]:
    """``{name: whole array}`` of ``model``'s state on every rank of the tensor-parallel ``group`` (see the module
    docstring)."""
    splits = tensor_parallel_splits(model)
    out = {}
    for name, value in model.state_dict().items():
        if name in splits:
            parts: list = []
            pdist.all_gather(parts, value.detach(), group=group)
            value = paddle.concat(parts, axis=splits[name])
        out[name] = to_numpy(value, keep_float16=True)
    return out


def single_card_model(model: paddle.nn.Layer) -> paddle.nn.Layer:
    """The one-card twin of a tensor-parallel ``model`` (its ``single_card_model()``); a ConfigError saying how to
    export otherwise."""
    build = getattr(model, "single_card_model", None)
    if not callable(build):
        raise ConfigError(f"export: {type(model).__name__} is tensor parallel and has no single_card_model() giving "
                          "the same architecture on one card: add that method, or export its final checkpoint on one "
                          "process: trainer.checkpoint.load.load_weights(single_card_model, "
                          "'OUTPUT_DIR/checkpoints/step-N'), then Trainer(single_card_model, args).export()")
    return build()
