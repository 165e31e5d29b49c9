"""The optimizer ``TrainingArguments.optim`` names, built over the trainable parameters.

Weight decay goes to the parameters the run's recipe names (``trainer.recipe``: ours, those with 2+
dims; PaddleNLP's, names without "bias" or "norm"). AdamW takes them through
``apply_decay_param_fun``; Momentum and SGD through two parameter groups, except when the optimizer
clips itself (``grad_clip``, which the layout asks for: ``trainer.optim.clipping.optimizer_grad_clip``):
paddle clips each group by its own norm, so the parameters then stay one group and weight decay is
refused.

    >>> import paddle
    >>> from trainer import TrainingArguments
    >>> layer = paddle.nn.Linear(2, 1)
    >>> args = TrainingArguments(output_dir="out", optim="momentum", weight_decay=0.01)
    >>> type(build_optimizer(args, 0.1, layer.parameters(), {layer.weight.name}, None, "one process")).__name__
    'Momentum'
    >>> build_optimizer(args, 0.1, layer.parameters(), {layer.weight.name}, paddle.nn.ClipGradByGlobalNorm(1.0),
    ...                 "sharding stage 2")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    trainer.errors.ConfigError: optim=momentum with weight_decay and max_grad_norm under sharding stage 2: ...
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional, Union

import paddle

from ..errors import ConfigError, option


def peak_lr(args, global_batch_size: int) -> float:
    """``learning_rate``, times global batch / ``scale_lr_by_batch`` when set (linear scaling rule)."""
    if args.scale_lr_by_batch:
        return args.learning_rate * global_batch_size / args.scale_lr_by_batch
    return args.learning_rate


def build_optimizer(args, lr: Union[float, paddle.optimizer.lr.LRScheduler], params: list, decay_names: Iterable[str],
                    grad_clip: Optional[paddle.nn.ClipGradBase], where: str) -> paddle.optimizer.Optimizer:
    """``args.optim`` over ``params`` at ``lr``, weight decay on ``decay_names``, clipping with ``grad_clip`` inside
    its step (None: the loop clips). ``where`` names the layout in the error of a clip that cannot be global."""
    decay_names = set(decay_names)
    if args.optim == "adamw":
        return paddle.optimizer.AdamW(learning_rate=lr, parameters=params, weight_decay=args.weight_decay,
                                      beta1=args.adam_beta1, beta2=args.adam_beta2, epsilon=args.adam_epsilon,
                                      apply_decay_param_fun=lambda name: name in decay_names, grad_clip=grad_clip)
    groups = [{"params": [p for p in params if p.name in decay_names], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.name not in decay_names], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if grad_clip is not None:  # paddle clips each parameter group by its own norm: one group keeps the norm global
        if args.weight_decay:
            raise ConfigError(f"optim={args.optim} with weight_decay and max_grad_norm under {where}: "
                              "paddle's optimizer would clip its decayed and undecayed parameters by two norms; "
                              f"use {option('optim', 'adamw')}, or {option('weight_decay', 0.0)}")
        groups = params
    if args.optim == "momentum":
        return paddle.optimizer.Momentum(learning_rate=lr, momentum=args.momentum, parameters=groups, grad_clip=grad_clip)
    return paddle.optimizer.SGD(learning_rate=lr, parameters=groups, grad_clip=grad_clip)
