"""Gradient clipping by global L2 norm that works with mixed-dtype gradients.

Under AMP O2 most parameters (and so their gradients) are float16 or bfloat16,
but paddle keeps BatchNorm (and, for float16, LayerNorm) weights in float32.
``paddle.nn.utils.clip_grad_norm_`` stacks per-tensor norms of different dtypes
and raises on that mix, and on CPU ``p_norm`` has no float16 kernel at all.
:func:`clip_grad_norm` computes each tensor's norm in float32, combines them in
float32, and scales every gradient in place by the coefficient cast to that
gradient's own dtype. Everything stays on the device: no host sync.

Where the clip runs is the run's layout's to say (``layout.clips_in_optimizer``: sharding, tensor and pipeline
parallel, master gradients): :func:`optimizer_grad_clip` is the ``grad_clip`` the optimizer is built with (paddle's
``ClipGradByGlobalNorm``, whose norm paddle reduces over the groups), :func:`clip_before_step` the loop's clip
before the step (None where the optimizer clips).

Example::

    >>> import paddle
    >>> layer = paddle.nn.Linear(2, 1)
    >>> layer(paddle.ones([1, 2])).sum().backward()
    >>> float(clip_grad_norm(layer.parameters(), max_norm=1.0)) > 1.0
    True
"""

from __future__ import annotations

from typing import Iterable, Optional

import paddle


def clip_grad_norm(parameters: Iterable[paddle.Tensor], max_norm: float) -> paddle.Tensor:
    """Scale the gradients of ``parameters`` so their global L2 norm is at most ``max_norm``.

    Returns the norm before clipping: a float32 device tensor (0 when no
    parameter has a gradient). A non-finite norm is returned as it is and the
    gradients are scaled by a non-finite coefficient, as paddle's own
    ``clip_grad_norm_(error_if_nonfinite=False)`` does; the loss scaler then
    skips that step.
    """
    with paddle.no_grad():
        return _clip([p.grad for p in parameters if p.grad is not None], float(max_norm))


def _clip(grads, max_norm: float) -> paddle.Tensor:
    if not grads:
        return paddle.zeros([], dtype="float32")
    norms = [paddle.linalg.norm(g.detach().astype("float32") if g.dtype != paddle.float32 else g.detach())
             for g in grads]
    total = paddle.linalg.norm(paddle.stack(norms)) if len(norms) > 1 else norms[0]
    # paddle's ClipGradByGlobalNorm's coefficient, which sharded runs clip with inside the optimizer (trainer.parallel):
    # the same arithmetic in every layout
    coef = max_norm / paddle.maximum(total, paddle.full([], max_norm, dtype="float32"))
    by_dtype = {}
    for g in grads:
        if g.dtype == paddle.float16 and g.place.is_cpu_place():
            # paddle's CPU build has no float16 multiply: scale in float32, store back as float16
            paddle.assign((g.astype("float32") * coef).astype(g.dtype), output=g)
            continue
        scale = by_dtype.get(g.dtype)
        if scale is None:
            scale = by_dtype[g.dtype] = coef if g.dtype == paddle.float32 else coef.astype(g.dtype)
        g.multiply_(scale)
    return total


def optimizer_grad_clip(layout, max_norm: Optional[float]):
    """The ``grad_clip`` an optimizer must be built with: paddle's ``ClipGradByGlobalNorm`` when the layout
    clips inside the optimizer step (``layout.clips_in_optimizer``) and clipping is on, else None."""
    if layout.clips_in_optimizer and max_norm:
        return paddle.nn.ClipGradByGlobalNorm(clip_norm=float(max_norm))
    return None


def clip_before_step(layout, parameters: Iterable[paddle.Tensor], max_norm: float,
                     clip=clip_grad_norm) -> Optional[paddle.Tensor]:
    """The loop's clip: by the global norm here with ``clip`` (the run's recipe: ours or PaddleNLP's arithmetic;
    returned as a device tensor), or None when paddle's optimizer clips inside its step (sharding: the gradients
    are reduced, and split, only there)."""
    if layout.clips_in_optimizer:
        return None
    return clip(parameters, max_norm)
