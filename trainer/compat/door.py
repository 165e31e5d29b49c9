"""The door: PaddleNLP's ``Trainer(...)`` keywords, arguments and callbacks
translated into this project's, once, in ``Trainer.__init__``.

=================================  ==============================================
PaddleNLP                          here
=================================  ==============================================
``args`` (paddlenlp                our ``TrainingArguments``, field by field
TrainingArguments or a subclass)   (``trainer.compat.args_convert``)
``data_collator``                  ``collate_fn``
``criterion``                      ``loss_fn``
``optimizers=(opt, scheduler)``    ``optimizer``, ``lr_scheduler``
``tokenizer``                      ``trainer.tokenizer`` (saved by ``save_model``;
                                   without a collator, batches are padded with
                                   paddlenlp's ``DataCollatorWithPadding``)
``preprocess_logits_for_metrics``  ``trainer.preprocess_predictions``
PaddleNLP's data order, decay       ``trainer.recipe``: PaddleNLP's
rule, schedule, clipping, logs      (``trainer.compat.paddlenlp_recipe``)
PaddleNLP ``TrainerCallback``      one ``PaddleNLPCallbacks`` adapter
``paddle.callbacks.Callback``      one ``HapiCallbacks`` adapter
=================================  ==============================================

Nothing here imports paddlenlp unless a paddlenlp object was given.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

from ..args import TrainingArguments
from ..args.arguments import _suggest
from ..errors import ConfigError

PADDLENLP_KEYWORDS = ("data_collator", "criterion", "optimizers", "tokenizer", "preprocess_logits_for_metrics")


@dataclass
class Translated:
    args: Any
    callbacks: List[Any]
    loss_fn: Optional[Callable]
    collate_fn: Optional[Callable]
    optimizer: Any
    lr_scheduler: Any
    tokenizer: Any = None
    preprocess_predictions: Optional[Callable] = None
    paddlenlp_args: Any = None
    recipe: Any = None  # trainer.recipe.Recipe, or PaddleNLP's for a PaddleNLP TrainingArguments


def translate_init(args, callbacks, loss_fn, collate_fn, optimizer, lr_scheduler, extra: dict) -> Translated:
    """Our constructor's values from PaddleNLP's keywords (``extra``) and objects."""
    for key in extra:
        if key not in PADDLENLP_KEYWORDS:
            raise ConfigError(f"Trainer() got an unknown keyword {key!r}{_suggest(key, _our_keywords() + list(PADDLENLP_KEYWORDS))}")
    out = Translated(args, [], loss_fn, collate_fn, optimizer, lr_scheduler)
    out.loss_fn = _one("loss_fn", loss_fn, "criterion", extra.get("criterion"))
    out.collate_fn = _one("collate_fn", collate_fn, "data_collator", extra.get("data_collator"))
    if extra.get("optimizers") is not None:
        pair = extra["optimizers"]
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ConfigError("optimizers must be a pair (optimizer, lr_scheduler); either may be None")
        out.optimizer = _one("optimizer", optimizer, "optimizers[0]", pair[0])
        out.lr_scheduler = _one("lr_scheduler", lr_scheduler, "optimizers[1]", pair[1])
    out.tokenizer = extra.get("tokenizer")
    out.preprocess_predictions = extra.get("preprocess_logits_for_metrics")
    if out.collate_fn is None and out.tokenizer is not None and _is_paddlenlp(out.tokenizer):
        from paddlenlp.data import DataCollatorWithPadding  # what PaddleNLP's Trainer does with a tokenizer

        out.collate_fn = DataCollatorWithPadding(out.tokenizer)
    if args is not None and not isinstance(args, TrainingArguments):
        if not _is_paddlenlp(args):
            raise ConfigError(f"args must be a trainer.TrainingArguments (or a paddlenlp TrainingArguments), "
                              f"got {type(args).__name__}")
        from .args_convert import convert_args

        from .paddlenlp_recipe import PaddleNLPRecipe

        out.paddlenlp_args = args
        out.args = convert_args(args)
        out.recipe = PaddleNLPRecipe(args)  # PaddleNLP's arguments, PaddleNLP's numbers (trainer.compat.paddlenlp_recipe)
    out.callbacks = adapt_callbacks(list(callbacks or []), existing=())
    if out.recipe is None:
        from ..recipe import Recipe

        out.recipe = Recipe()
    return out


def _our_keywords() -> list:
    return ["model", "args", "train_dataset", "eval_dataset", "loss_fn", "collate_fn", "optimizer", "lr_scheduler",
            "compute_metrics", "callbacks"]


def _one(ours: str, value, theirs: str, other):
    if value is not None and other is not None:
        raise ConfigError(f"both {ours} and {theirs} were given: pass one of them")
    return value if value is not None else other


def _is_paddlenlp(obj) -> bool:
    return any(type(obj).__module__.startswith("paddlenlp") or c.__module__.startswith("paddlenlp")
               for c in type(obj).__mro__)


def _paddlenlp_callback_class():
    module = sys.modules.get("paddlenlp.trainer.trainer_callback")
    return getattr(module, "TrainerCallback", None) if module else None


def kind_of(callback) -> str:
    """``ours``, ``paddlenlp`` or ``hapi`` (an instance or a class)."""
    from callbacks.base import Callback
    from paddle.hapi.callbacks import Callback as HapiCallback

    cls = callback if isinstance(callback, type) else type(callback)
    if issubclass(cls, Callback):
        return "ours"
    pnlp = _paddlenlp_callback_class()
    if pnlp is not None and issubclass(cls, pnlp):
        return "paddlenlp"
    if issubclass(cls, HapiCallback):
        return "hapi"
    return "other"


def adapt_callbacks(items: list, existing) -> list:
    """Our callbacks as given; PaddleNLP and hapi callbacks joined into one adapter each
    (appended to the adapter already in ``existing`` when there is one). Returns the callbacks to add."""
    from .hapi_callbacks import HapiCallbacks
    from .paddlenlp_callbacks import PaddleNLPCallbacks

    out: list = []
    adapters = {"paddlenlp": PaddleNLPCallbacks, "hapi": HapiCallbacks}
    for item in items:
        kind = kind_of(item)
        if kind == "ours":
            out.append(item)
            continue
        if kind == "other":
            raise ConfigError(f"{item!r} is not a callback: pass a callbacks.Callback, a paddlenlp TrainerCallback "
                              "or a paddle.callbacks.Callback")
        cls = adapters[kind]
        adapter = next((cb for cb in list(existing) + out if isinstance(cb, cls)), None)
        if adapter is None:
            adapter = cls()
            out.append(adapter)
        adapter.append(item)
    return out
