"""``SFTTrainer``: PaddleFormers 1.2's ``SFTTrainer`` (``paddleformers.cli.train.sft.sft_trainer``) on this
project's loop, taking the same arguments.

===================================  =========================================================================
PaddleFormers' SFTTrainer            here
===================================  =========================================================================
``args``: an ``SFTConfig`` (or its   the same, through the door (``trainer.compat.door``): converted field by
``TrainingArguments``, turned into   field, PaddleFormers' numbers (``trainer.compat.paddleformers_recipe``);
an ``SFTConfig``), None for          our ``TrainingArguments`` too (the SFT options then take ``SFTConfig``'s
``SFTConfig("tmp_trainer")``         defaults)
``model``: a layer, or a name for    the same; ``model_init_kwargs`` as theirs
``AutoModelForCausalLM``
the datasets: a ``datasets.Dataset`` PaddleFormers' own ``_prepare_dataset`` (run over the same options): chat,
formatted and tokenized; a paddle    instruction and src/tgt formats found, ``dataset_text_field`` tokenized up
dataset (``create_dataset``'s packed to ``max_seq_len``, labels shifted; a paddle dataset as it is (a packed
/ greedy-intokens streams) as it is  stream goes through ``trainer.data.iterable``)
no ``data_collator``                 ``DataCollatorForSeq2Seq(tokenizer)``, as theirs
``log``: ``ppl = exp(loss)``,        the same, from the loss as the recipe logs it (rounded as theirs)
``eval_ppl = exp(eval_loss)``
``prediction_step``: arg-max of the  ``evaluation_step``: the same arg-max (keepdim); with ``do_generation``,
logits; ``do_generation``:           ``model.generate`` as theirs; ``prediction_loss_only``: loss alone
sampled tokens
``set_optimizer_grouped_parameters`` the parameters the optimizer updates (``run_sft`` passes the trainable ones)
``get_ptq_dataloader``, ``ptq_loop`` not here (post-training quantization): refused in one line
===================================  =========================================================================

PaddleFormers' ``main_process_first()`` around the preparation is left out: each rank tokenizes its own
copy (the same tokens; only ``datasets``' cache would have been shared).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import types
from typing import Callable, Optional

from ..errors import ConfigError
from ..trainer import Trainer

logger = logging.getLogger("trainer")

SFT_DEFAULTS = {"max_seq_len": 2048, "dataset_text_field": "text", "dataset_num_proc": None,
                "dataset_batch_size": 1000, "dataset_kwargs": None, "model_init_kwargs": None,
                "remove_unused_columns": True}  # SFTConfig's, for our own TrainingArguments


class SFTTrainer(Trainer):
    """A ``trainer.Trainer`` with PaddleFormers' ``SFTTrainer``'s constructor and additions (module docstring).

    ``from trainer.sft import SFTTrainer`` in place of ``from paddleformers.cli.train.sft.sft_trainer import
    SFTTrainer``; everything else in the script stays."""

    def __init__(self, model=None, criterion=None, args=None, data_collator=None, train_dataset=None,
                 eval_dataset=None, tokenizer=None, compute_metrics: Optional[Callable] = None, callbacks=None,
                 optimizers=(None, None), preprocess_logits_for_metrics: Optional[Callable] = None,
                 do_generation: bool = False, gen_args=None, data_args=None,
                 formatting_func: Optional[Callable] = None, **kwargs):
        if do_generation and (gen_args is None or data_args is None):
            raise ConfigError("SFTTrainer(do_generation=True) needs gen_args and data_args (top_k, top_p, max_length)")
        self.do_generation, self.gen_args, self.data_args = do_generation, gen_args, data_args
        args = _sft_config(args)
        model, tokenizer = _model_and_tokenizer(model, tokenizer, args)
        if _option(args, "max_seq_len") is None:
            args.max_seq_len = min(tokenizer.model_max_length, 1024)
            logger.warning("no max_seq_len was given to the SFTTrainer: it is %d", args.max_seq_len)
        self.dataset_num_proc = _option(args, "dataset_num_proc")
        self.dataset_batch_size = _option(args, "dataset_batch_size")
        dataset_kwargs = dict(_option(args, "dataset_kwargs") or {})
        if formatting_func is None:
            from paddleformers.cli.train.sft.dataset_formatting import (
                get_formatting_func_from_dataset,
            )

            # a chat, instruction or src/tgt dataset: its template adds the special tokens
            formatting_func = get_formatting_func_from_dataset(train_dataset, tokenizer)
            if formatting_func is not None:
                dataset_kwargs["add_special_tokens"] = False
        if hasattr(args, "dataset_kwargs"):
            args.dataset_kwargs = dataset_kwargs  # as theirs: what the preparation used stays on the arguments
        prepare = self._preparer(tokenizer, args, formatting_func, dataset_kwargs)
        if train_dataset is not None:
            train_dataset = prepare(train_dataset)
        if eval_dataset is not None:
            eval_dataset = ({name: prepare(d) for name, d in eval_dataset.items()} if isinstance(eval_dataset, dict)
                            else prepare(eval_dataset))
        if data_collator is None:
            from paddleformers.data import DataCollatorForSeq2Seq

            data_collator = DataCollatorForSeq2Seq(tokenizer=tokenizer)
        self.optimizer_grouped_parameters = None
        door_args = _without_sft_options(args)
        super().__init__(model=model, args=door_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                         compute_metrics=compute_metrics, callbacks=callbacks, criterion=criterion,
                         data_collator=data_collator, tokenizer=tokenizer, optimizers=optimizers,
                         preprocess_logits_for_metrics=preprocess_logits_for_metrics, **kwargs)
        self.sft_args = args  # the SFTConfig given (the door converted it into self.args)
        for callback in self.callbacks:  # their callbacks see the SFTConfig as given
            if door_args is not args and getattr(callback, "paddlenlp_args", None) is door_args:
                callback.paddlenlp_args = args
        self.recipe = PerplexityLog(self.recipe)

    def _preparer(self, tokenizer, args, formatting_func, dataset_kwargs) -> Callable:
        """PaddleFormers' own preparation of one dataset (its ``_prepare_dataset`` and
        ``_prepare_non_packed_dataloader``, which read ``dataset_num_proc`` and ``dataset_batch_size`` from their
        trainer: here from a small stand-in), so that formatting, tokenizing and labels are theirs to the token."""
        from paddleformers.cli.train.sft.sft_trainer import SFTTrainer as Theirs

        theirs = types.SimpleNamespace(dataset_num_proc=self.dataset_num_proc,
                                       dataset_batch_size=self.dataset_batch_size)
        theirs._prepare_non_packed_dataloader = types.MethodType(Theirs._prepare_non_packed_dataloader, theirs)

        def prepare(dataset):
            return Theirs._prepare_dataset(theirs, dataset, tokenizer, _option(args, "dataset_text_field"),
                                           _option(args, "max_seq_len"), formatting_func,
                                           remove_unused_columns=_option(args, "remove_unused_columns"),
                                           **dataset_kwargs)

        return prepare

    # ---- what SFTTrainer changes in the loop's building blocks ------------------------------------------------
    def evaluation_step(self, model, batch):
        """As their ``prediction_step``: the arg-max of the logits (keepdim), not the logits; sampled tokens with
        ``do_generation``; the loss alone with ``prediction_loss_only``."""
        if self.do_generation and not self._loss_only():
            return self._generate(model, batch)
        loss, logits, labels = super().evaluation_step(model, batch)
        if self._loss_only():
            return loss, None, None
        if isinstance(logits, (list, tuple)):
            logits = logits[0]
        return loss, (logits.argmax(axis=-1, keepdim=True) if logits is not None else None), labels

    def _loss_only(self) -> bool:
        return bool(getattr(self.sft_args, "prediction_loss_only", False)) or \
            getattr(self.sft_args, "pipeline_model_parallel_size", 1) > 1

    def _generate(self, model, batch):
        """Their generation in evaluation: sampled continuations, pad tokens dropped, rows padded with -100."""
        import paddle

        tok = self.tokenizer
        tokens = model.generate(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                                position_ids=batch.get("position_ids"),
                                max_length=max(self.data_args.max_length - batch["input_ids"].shape[-1], 1),
                                decode_strategy="sampling", top_k=self.gen_args.top_k, top_p=self.gen_args.top_p,
                                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                pad_token_id=tok.pad_token_id, use_cache=True)[0]
        rows = [[t for t in row.numpy().tolist() if t != tok.pad_token_id] for row in tokens]
        width = max(len(r) for r in rows)
        preds = paddle.to_tensor([r + [-100] * (width - len(r)) for r in rows])
        labels = paddle.to_tensor(batch["labels"]) if "labels" in batch else None
        return None, preds, labels

    def set_optimizer_grouped_parameters(self, optimizer_grouped_parameters=None) -> None:
        """PaddleFormers' hook for the parameters to train (``run_sft`` passes the trainable ones). Here the
        optimizer updates the parameters without ``stop_gradient``; another set is refused in one line."""
        if optimizer_grouped_parameters is not None:
            given = {p.name for p in optimizer_grouped_parameters}
            trainable = {p.name for p in self.model.parameters() if not p.stop_gradient}
            if given != trainable:
                raise ConfigError(f"set_optimizer_grouped_parameters: {len(given)} parameters given, the optimizer "
                                  f"trains the model's {len(trainable)} without stop_gradient: set stop_gradient "
                                  "on the model's parameters instead")
        self.optimizer_grouped_parameters = optimizer_grouped_parameters

    def save_model(self, output_dir: Optional[str] = None, merge_tensor_parallel: bool = False,
                   last_fc_to_hf: bool = False) -> str:
        """``save_model`` with PaddleFormers' ``last_fc_to_hf`` (``run_sft`` passes it): the files are the model's
        ``save_pretrained`` ones either way, which ``from_pretrained`` loads (their flex-checkpoint format is
        not written here)."""
        return super().save_model(output_dir, merge_tensor_parallel=merge_tensor_parallel)

    def get_ptq_dataloader(self, ptq_ds):
        raise ConfigError("SFTTrainer.get_ptq_dataloader: post-training quantization is not supported here; "
                          "run it with PaddleFormers' SFTTrainer")

    def ptq_loop(self, dataloader, description, max_eval_iters=-1):
        raise ConfigError("SFTTrainer.ptq_loop: post-training quantization is not supported here; "
                          "run it with PaddleFormers' SFTTrainer")


class PerplexityLog:
    """The run's recipe (``trainer.recipe``) with SFTTrainer's ``log``: ``ppl`` beside a training record's
    ``loss``, ``eval_ppl`` beside ``eval_loss`` (from the values as logged), in the records and in what
    ``evaluate()`` returns (their ``log`` adds it to the metrics dict that ``evaluate`` returns)."""

    def __init__(self, recipe):
        self.inner = recipe

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @staticmethod
    def _with_ppl(record: dict) -> dict:
        if "loss" in record:
            record["ppl"] = math.exp(record["loss"])
        if "eval_loss" in record:
            record["eval_ppl"] = math.exp(record["eval_loss"])
        return record

    def log_record(self, trainer, record: dict) -> dict:
        return self._with_ppl(self.inner.log_record(trainer, record))

    def eval_result(self, trainer, metrics: dict) -> dict:
        return self._with_ppl(self.inner.eval_result(trainer, metrics))


def _without_sft_options(args):
    """What the door converts: a copy of a PaddleFormers SFTConfig with the options this trainer used (the
    preparation's) at their defaults, so that its warning names only the fields without an effect."""
    if not hasattr(args, "dataset_text_field") or not dataclasses.is_dataclass(args):
        return args
    out = copy.copy(args)
    defaults = {f.name: f.default for f in dataclasses.fields(args) if f.default is not dataclasses.MISSING}
    for name in SFT_DEFAULTS:
        if name in defaults and name != "remove_unused_columns":
            object.__setattr__(out, name, defaults[name])
    return out


def _option(args, name):
    """An SFT option: the SFTConfig's field, or SFTConfig's default on our own TrainingArguments."""
    return getattr(args, name, SFT_DEFAULTS.get(name))


def _sft_config(args):
    """Their rule: no arguments is ``SFTConfig(output_dir="tmp_trainer")``; a PaddleFormers
    ``TrainingArguments`` becomes an ``SFTConfig`` of the same fields. Ours and SFTConfig stay as given."""
    from ..args import TrainingArguments

    if isinstance(args, TrainingArguments):
        return args
    from paddleformers.cli.train.sft.sft_config import SFTConfig

    if args is None:
        logger.warning("no SFTConfig was given to the SFTTrainer: using output_dir=tmp_trainer")
        return SFTConfig(output_dir="tmp_trainer")
    if type(args).__name__ == "TrainingArguments" and type(args).__module__.startswith("paddleformers"):
        fields = args.to_dict()
        fields.update({k: getattr(args, k) for k in fields if k.endswith("_token")})  # to_dict redacts tokens
        return SFTConfig(**fields)
    return args


def _model_and_tokenizer(model, tokenizer, args):
    """A model name loads ``AutoModelForCausalLM`` (with ``model_init_kwargs``) and, without a tokenizer, its
    tokenizer (pad token = eos token when it has none), as theirs."""
    init_kwargs = _option(args, "model_init_kwargs")
    if init_kwargs is not None and not isinstance(model, str):
        raise ConfigError("model_init_kwargs was given in the SFTConfig, but the model is already built: "
                          "pass the model's name, or drop model_init_kwargs")
    name = model if isinstance(model, str) else None
    if name is not None:
        import paddle
        from paddleformers.transformers import AutoModelForCausalLM

        kwargs = dict(init_kwargs or {})
        dtype = kwargs.get("dtype")
        if isinstance(dtype, str) and dtype != "auto":
            kwargs["dtype"] = getattr(paddle, dtype)
        model = AutoModelForCausalLM.from_pretrained(name, **kwargs)
    if tokenizer is None:
        if name is None:
            raise ConfigError("SFTTrainer needs a tokenizer: SFTTrainer(..., tokenizer=...) "
                              "(or a model name to load it from)")
        from paddleformers.transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name)
        if getattr(tokenizer, "pad_token", None) is None:
            tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
