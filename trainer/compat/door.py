"""The door: PaddleNLP's (and PaddleFormers') ``Trainer(...)`` keywords, arguments and
callbacks translated into this project's, once, in ``Trainer.__init__``.

=================================  ==============================================
PaddleNLP                          here
=================================  ==============================================
``args`` (paddlenlp or             our ``TrainingArguments``, field by field
paddleformers TrainingArguments    (``trainer.compat.args_convert``)
or a subclass)
``data_collator``                  ``collate_fn``
``criterion``                      ``loss_fn``
``optimizers=(opt, scheduler)``    ``optimizer``, ``lr_scheduler``
``tokenizer``                      ``trainer.tokenizer`` (saved by ``save_model``;
                                   without a collator, batches are padded with
                                   their ``DataCollatorWithPadding``)
``processing_class``               ``trainer.processing_class`` (PaddleFormers;
                                   saved by ``save_model``)
``resume_from_custom_func``        called with the model after the callbacks'
                                   ``on_train_begin`` (PaddleFormers)
``preprocess_logits_for_metrics``  ``trainer.preprocess_predictions``
PaddleNLP's data order, decay       ``trainer.recipe``: PaddleNLP's
rule, schedule, clipping, logs      (``trainer.compat.paddlenlp_recipe``), or
                                   PaddleFormers' (``...paddleformers_recipe``)
PaddleNLP ``TrainerCallback``      one ``PaddleNLPCallbacks`` adapter (PaddleFormers'
                                   too: ``on_save_hf``)
``paddle.callbacks.Callback``      one ``HapiCallbacks`` adapter
=================================  ==============================================

Nothing here imports paddlenlp (or paddleformers) unless such an object was given.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

from ..args import TrainingArguments
from ..args.arguments import _suggest
from ..errors import ConfigError

PADDLENLP_KEYWORDS = ("data_collator", "criterion", "optimizers", "tokenizer", "preprocess_logits_for_metrics")
# PaddleFormers' Trainer adds these two (processing_class: its name for the tokenizer or processor)
PADDLEFORMERS_KEYWORDS = ("processing_class", "resume_from_custom_func")


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
    paddlenlp_args: Any = None  # the PaddleNLP or PaddleFormers TrainingArguments given
    resume_from_custom_func: Optional[Callable] = None  # PaddleFormers': called with the model as training begins
    processing_class: Any = None  # PaddleFormers': an image processor or the like, saved by save_model
    recipe: Any = None  # trainer.recipe.Recipe, or PaddleNLP's for a PaddleNLP TrainingArguments


def translate_init(args, callbacks, loss_fn, collate_fn, optimizer, lr_scheduler, extra: dict) -> Translated:
    """Our constructor's values from PaddleNLP's keywords (``extra``) and objects."""
    theirs = PADDLENLP_KEYWORDS + PADDLEFORMERS_KEYWORDS
    for key in extra:
        if key not in theirs:
            raise ConfigError(f"Trainer() got an unknown keyword {key!r}{_suggest(key, _our_keywords() + list(theirs))}")
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
    out.processing_class = extra.get("processing_class")  # PaddleFormers': saved beside the model, never pads
    out.preprocess_predictions = extra.get("preprocess_logits_for_metrics")
    out.resume_from_custom_func = extra.get("resume_from_custom_func")
    if out.resume_from_custom_func is not None and not callable(out.resume_from_custom_func):
        raise ConfigError("resume_from_custom_func must be a callable taking the model")
    origin = framework_of(out.tokenizer)
    if out.collate_fn is None and out.tokenizer is not None and origin is not None:
        # what their Trainers do with a tokenizer (a processor without padding is left to the default collation)
        collator = __import__(f"{origin}.data", fromlist=["DataCollatorWithPadding"]).DataCollatorWithPadding
        if hasattr(out.tokenizer, "pad"):
            out.collate_fn = collator(out.tokenizer)
    if args is not None and not isinstance(args, TrainingArguments):
        origin = framework_of(args)
        if origin is None:
            raise ConfigError(f"args must be a trainer.TrainingArguments (or a paddlenlp or paddleformers "
                              f"TrainingArguments), got {type(args).__module__}.{type(args).__name__}")
        from .args_convert import convert_args

        out.paddlenlp_args = args
        out.args = convert_args(args, origin)
        if origin == "paddleformers":
            from .paddleformers_recipe import PaddleFormersRecipe

            out.recipe = PaddleFormersRecipe(args)  # its numbers (trainer.compat.paddleformers_recipe)
        else:
            from .paddlenlp_recipe import PaddleNLPRecipe

            out.recipe = PaddleNLPRecipe(args)  # PaddleNLP's arguments, PaddleNLP's numbers (trainer.compat.paddlenlp_recipe)
    out.callbacks = adapt_callbacks(list(callbacks or []), existing=())
    if out.recipe is None:
        from ..recipe import Recipe

        out.recipe = Recipe()
    return out


def fit_model_to_device(model, device: str) -> None:
    """A PaddleFormers model's config asks for fused RMSNorm by default (``fuse_rms_norm``), a GPU kernel: on CPU
    (where its own Trainer fails at the first step: ``fused_rms_norm_ext`` is not registered) it is turned off,
    named in one warning: its norm layers read the flag at each call and compute the same formula unfused."""
    if "cpu" not in str(device).lower() or framework_of(model) != "paddleformers":
        return
    norms = [layer for layer in model.sublayers() if "RMSNorm" in type(layer).__name__]  # paddleformers.nn.norm's
    configs = {id(c): c for c in (getattr(layer, "config", None) for layer in norms)
               if c is not None and callable(getattr(c, "get", None))}
    fused = [c for c in configs.values() if c.get("fuse_rms_norm", True)]  # its norm layers' reading: unset = on
    for config in fused:
        config.fuse_rms_norm = False
    if fused:
        import logging

        logging.getLogger("trainer").warning("the model's config has fuse_rms_norm=True, a GPU kernel this CPU run "
                                             "lacks: turned off (the same RMSNorm, unfused)")


def _our_keywords() -> list:
    return ["model", "args", "train_dataset", "eval_dataset", "loss_fn", "collate_fn", "optimizer", "lr_scheduler",
            "compute_metrics", "callbacks"]


def _one(ours: str, value, theirs: str, other):
    if value is not None and other is not None:
        raise ConfigError(f"both {ours} and {theirs} were given: pass one of them")
    return value if value is not None else other


FRAMEWORKS = ("paddlenlp", "paddleformers")


def framework_of(obj) -> Optional[str]:
    """``paddlenlp`` or ``paddleformers`` when ``obj``'s class (or a base) comes from it; else None."""
    if obj is None:
        return None
    for c in type(obj).__mro__:
        root = c.__module__.split(".", 1)[0]
        if root in FRAMEWORKS:
            return root
    return None


def _foreign_callback_classes() -> list:
    """(framework, TrainerCallback) of each of PaddleNLP and PaddleFormers already imported."""
    out = []
    for origin in FRAMEWORKS:
        module = sys.modules.get(f"{origin}.trainer.trainer_callback")
        cls = getattr(module, "TrainerCallback", None) if module else None
        if cls is not None:
            out.append((origin, cls))
    return out


def kind_of(callback) -> str:
    """``ours``, ``paddlenlp`` or ``hapi`` (an instance or a class)."""
    from paddle.hapi.callbacks import Callback as HapiCallback

    from callbacks.base import Callback

    cls = callback if isinstance(callback, type) else type(callback)
    if issubclass(cls, Callback):
        return "ours"
    for _origin, theirs in _foreign_callback_classes():
        if issubclass(cls, theirs):
            return "paddlenlp"  # PaddleFormers' TrainerCallback is PaddleNLP's, plus on_save_hf: one adapter
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
            raise ConfigError(f"{item!r} is not a callback: pass a callbacks.Callback, a paddlenlp or paddleformers "
                              "TrainerCallback or a paddle.callbacks.Callback")
        cls = adapters[kind]
        adapter = next((cb for cb in list(existing) + out if isinstance(cb, cls)), None)
        if adapter is None:
            adapter = cls()
            out.append(adapter)
        adapter.append(item)
    return out
