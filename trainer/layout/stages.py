"""The whole model's names for what one pipeline stage holds: checkpoints of a pipeline-parallel run use them.

A ``PipelineLayer`` names its layers by their index in the whole pipeline (``"3.linear.weight"``), so a stage's
names are the same whatever the number of stages. A model that also exists as one single-card layer (the ERNIE
task's ``ErniePipe`` and paddlenlp's ``ErnieForSequenceClassification``) says how its names map with
``single_card_names() -> {name in this stage: name in the single-card model}``; checkpoints then hold the
single-card names, so a run resumes across pipeline degrees, onto one process (pp 2 -> 1 -> 2), and export merges
the stages into the single-card model. Every other model keeps its own names.

    >>> import paddle
    >>> whole_names(paddle.nn.Linear(2, 2))
    {}
"""

from __future__ import annotations

from typing import Dict, Optional

import paddle

from .. import distributed as dist
from ..errors import ConfigError


def whole_names(model: paddle.nn.Layer) -> Dict[str, str]:
    """``{structured name in ``model``: name in the whole model}`` where they differ; empty when they do not."""
    names = getattr(model, "single_card_names", None)
    return dict(names()) if callable(names) else {}


def whole_state(model: paddle.nn.Layer) -> dict:
    """``model.state_dict()`` under the whole model's names."""
    rename = whole_names(model)
    return {rename.get(k, k): v for k, v in model.state_dict().items()}


def own_names(model: paddle.nn.Layer, state: dict) -> dict:
    """``state`` (whole-model names) under ``model``'s own names (what its ``set_state_dict`` takes)."""
    back = {whole: local for local, whole in whole_names(model).items()}
    return {back.get(k, k): v for k, v in state.items()}


def held_optimizer_tensors(opt_tensors: dict, structured: set) -> dict:
    """The optimizer tensors of a checkpoint (``param:<name>_...`` / ``master:<name>``) of the parameters whose
    whole-model names are in ``structured``, and every tensor not tied to a parameter."""
    by_len = sorted(structured, key=len, reverse=True)

    def held(key: str) -> bool:
        for prefix in ("param:", "master:"):
            if key.startswith(prefix):
                rest = key[len(prefix):]
                return any(rest == s or rest.startswith(s + "_") for s in by_len)
        return True

    return {k: v for k, v in opt_tensors.items() if held(k)}


def whole_model(model: paddle.nn.Layer, pp_degree: int) -> Optional[paddle.nn.Layer]:
    """The model export writes: ``model`` itself, or under pipeline parallel (``pp_degree > 1``) the single-card
    model (``model.single_card_model()``) with every stage's weights put together on rank 0 (None on the other
    ranks). A collective under pipeline parallel: every rank calls it."""
    if pp_degree == 1:
        return model
    build = getattr(model, "single_card_model", None)
    if not callable(build) or not whole_names(model):
        raise ConfigError(f"export of a pipeline-parallel run needs the whole model: give {type(model).__name__} "
                          "single_card_model() and single_card_names() (models/ernie/pipeline.py shows both), or "
                          "export a checkpoint on one process (trainer.checkpoint.load.load_weights)")
    import paddle.distributed as pdist

    parts: list = []
    pdist.all_gather_object(parts, {k: v.numpy() for k, v in whole_state(model).items()})  # each stage its tensors
    if not dist.is_main_process():
        return None
    weights = {k: v for part in parts for k, v in part.items()}
    rng = paddle.get_rng_state()
    try:
        single = build()  # its initialisers draw from paddle's generator: the training run's stream is kept
    finally:
        paddle.set_rng_state(rng)
    own = single.state_dict()
    missing = sorted(set(own) - set(weights))
    if missing:
        raise ConfigError(f"export: the stages hold no {missing[:3]} of {type(single).__name__}: check "
                          f"{type(model).__name__}.single_card_names()")
    single.set_state_dict({k: paddle.to_tensor(weights[k]).astype(own[k].dtype) for k in own})
    single.eval()
    return single
