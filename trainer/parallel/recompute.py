"""Recompute (activation checkpointing): blocks of the model keep no activations in the forward pass
and run their forward again during the backward pass, trading compute for memory.

A PaddleNLP model switches it on itself: every sublayer with an ``enable_recompute`` attribute gets
it set, as PaddleNLP's Trainer does. Any other model: each block of its repeated layers (the children
of its outermost ``paddle.nn.LayerList``\\ s, or the sublayers named in ``recompute_modules``) runs
under paddle's ``paddle.distributed.fleet.utils.recompute`` with ``use_reentrant=False`` and the RNG
state preserved, so Dropout draws the same masks in the recomputation and gradients equal the plain
run's exactly. Parameter names do not change (the block's ``forward`` is wrapped in place), so
checkpoints load either way.

Example::

    >>> import paddle
    >>> net = paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.LayerList([paddle.nn.Linear(4, 4), paddle.nn.Linear(4, 4)]))
    >>> [name for name, _ in recomputed_blocks(net)]
    ['1.0', '1.1']
"""

from __future__ import annotations

import logging
from typing import Iterable, List, Optional, Sequence, Tuple

import paddle
from paddle.distributed.fleet.utils import recompute

from ..errors import ConfigError, TrainingError, option

logger = logging.getLogger("trainer")

_MARK = "_trainer_recompute"  # set on a block whose forward runs under recompute (applying twice is a no-op)


def uses_own_switch(model: paddle.nn.Layer) -> bool:
    """Whether the model has PaddleNLP's ``enable_recompute`` switch on some sublayer."""
    return any(hasattr(layer, "enable_recompute") for layer in model.sublayers(include_self=True))


def switches_own_recompute(model: paddle.nn.Layer, modules: Optional[Sequence[str]] = None) -> bool:
    """Whether :func:`apply_recompute` turns the model's own switch on (no ``modules`` named, a PaddleNLP model)
    rather than wrapping blocks itself. The model then recomputes as it was written to, reentrant or not
    (PaddleNLP's ERNIE: paddle's reentrant ``recompute``, whose backward runs inside the outer one)."""
    return not modules and uses_own_switch(model)


def recomputed_blocks(model: paddle.nn.Layer, modules: Optional[Sequence[str]] = None) -> List[Tuple[str, paddle.nn.Layer]]:
    """The blocks that run under recompute: ``(name, layer)`` in model order.

    ``modules`` names sublayers by their path in ``named_sublayers()`` (``encoder.layers``) or by class
    name (``TransformerEncoderLayer``); a named ``LayerList`` stands for its children. Without names,
    the children of every outermost ``LayerList``.
    """
    named = list(model.named_sublayers())
    if modules:
        wanted = set(modules)
        chosen = [(n, layer) for n, layer in named if n in wanted or type(layer).__name__ in wanted]
        found = {n for n, _ in chosen} | {type(layer).__name__ for _, layer in chosen}
        missing = [m for m in modules if m not in found]
        if missing:
            raise ConfigError(f"recompute_modules names {', '.join(map(repr, missing))}, which the model "
                              f"{type(model).__name__} does not have: give sublayer paths of named_sublayers() "
                              "or class names")
    else:
        chosen = [(n, layer) for n, layer in named if isinstance(layer, paddle.nn.LayerList)]
    blocks, seen = [], set()
    for name, layer in chosen:
        parts = list(layer.named_children()) if isinstance(layer, paddle.nn.LayerList) else [("", layer)]
        for child_name, child in parts:
            full = f"{name}.{child_name}" if child_name else name
            if any(full.startswith(p + ".") for p in seen) or full in seen:
                continue  # inside a block already chosen: the outer block recomputes it
            seen.add(full)
            blocks.append((full, child))
    return blocks


def apply_recompute(model: paddle.nn.Layer, modules: Optional[Sequence[str]] = None, use_reentrant: bool = False) -> int:
    """Switch recompute on for ``model``; returns how many blocks run under it (PaddleNLP switches count too).

    ``use_reentrant=True`` takes paddle's PyLayer implementation, which gives no gradient to a block's
    parameters when none of its tensor inputs requires one: such a call raises a TrainingError instead
    of training those parameters silently not at all.
    """
    if switches_own_recompute(model, modules):
        switched = 0
        for layer in model.sublayers(include_self=True):
            if hasattr(layer, "enable_recompute") and not layer.enable_recompute:
                layer.enable_recompute = True
                switched += 1
        return switched
    blocks = recomputed_blocks(model, modules)
    if not blocks:
        raise ConfigError(f"recompute=True but {type(model).__name__} has no LayerList of repeated blocks: name "
                          f"the sublayers to recompute with {option('recompute_modules', 'encoder.layers')}")
    for _, block in blocks:
        _wrap_forward(block, use_reentrant)
    return len(blocks)


def _wrap_forward(block: paddle.nn.Layer, use_reentrant: bool) -> None:
    if getattr(block, _MARK, False):
        return
    forward = block.forward

    def forward_under_recompute(*args, **kwargs):
        if not block.training or not paddle.is_grad_enabled():
            return forward(*args, **kwargs)  # evaluation: nothing to save, nothing to recompute
        if use_reentrant:
            _refuse_dropped_gradients(block, list(args) + list(kwargs.values()))
        return recompute(forward, *args, use_reentrant=use_reentrant, preserve_rng_state=True, **kwargs)

    # into the instance's __dict__, past the class's __setattr__: PaddleNLP patches TransformerEncoderLayer's to wrap
    # a new ``forward`` as an unbound function (it would be called with the layer as its first input)
    vars(block)["forward"] = forward_under_recompute
    setattr(block, _MARK, True)


def _refuse_dropped_gradients(block: paddle.nn.Layer, inputs: Iterable) -> None:
    tensors = [t for t in inputs if isinstance(t, paddle.Tensor)]
    trainable = any(not p.stop_gradient for p in block.parameters())
    if trainable and tensors and all(t.stop_gradient for t in tensors):
        raise TrainingError(f"reentrant recompute of {type(block).__name__} would give its parameters no gradient "
                            "(no input of the block requires one): use use_reentrant=False, as recompute=True does")
