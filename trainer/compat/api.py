"""PaddleNLPAPI: the methods a PaddleNLP ``Trainer`` script calls, on top of
``fit()`` / ``evaluate()`` / ``predict()`` (a mixin of ``trainer.Trainer``;
the same machinery, not a second loop):

- ``train(resume_from_checkpoint=None)`` -> :class:`TrainOutput` (global_step,
  training_loss, metrics: train_runtime, train_samples_per_second,
  train_steps_per_second, train_loss, progress_or_epoch); ``fit()`` plus a
  summary ``log``;
  ``resume_from_checkpoint=True`` means the latest checkpoint (``auto``);
- ``save_model(output_dir=None)``: the ``save_pretrained`` format (model, and
  the tokenizer when given) that ``from_pretrained`` loads; a plain
  ``paddle.nn.Layer`` is saved as ``model_state.pdparams``;
- ``log_metrics(split, metrics)``, ``save_metrics(split, metrics,
  combined=True)`` (``<split>_results.json`` and ``all_results.json``),
  ``save_state()`` (``trainer_state.json``), ``metrics_format(metrics)``;
- ``is_world_process_zero()``, ``is_local_process_zero()``,
  ``pop_callback(callback_or_class)``.

All of it writes on rank 0 only; every rank may call it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import shutil
from typing import Optional

from callbacks.base import Callback
from callbacks.logger import Rank0Logger

from ..checkpoint import fence
from ..loss import LossWindow

logger = logging.getLogger("trainer")


class _LossTotal(Callback):
    """Sums the step losses of one ``train()`` on the device (no host sync per step), as the loop's log window
    does: a pipeline stage that holds no loss counts its steps and takes the last stage's sum at the end."""

    order = 95

    def __init__(self):
        self.window = LossWindow()

    @property
    def state_key(self) -> str:
        return "_TrainLossTotal"

    def on_step_end(self, trainer):
        self.window.add(trainer.state.step_loss)


class PaddleNLPAPI:
    """The PaddleNLP names of ``trainer.Trainer``'s machinery."""

    tokenizer = None
    processing_class = None  # PaddleFormers' Trainer(processing_class=...): saved beside the model
    preprocess_predictions = None
    _in_train_api = False

    # ---- the door (called from Trainer.__init__) ------------------------------------
    def _compat_init_end(self, door) -> None:
        """``door``: the ``trainer.compat.door.Translated`` this trainer was made from."""
        from .door import fit_model_to_device
        from .paddleformers_recipe import PaddleFormersRecipe
        from .paddlenlp_callbacks import PaddleNLPCallbacks

        paddlenlp_args = door.paddlenlp_args
        self.processing_class = door.processing_class
        fit_model_to_device(self.model, self.device)
        # PaddleFormers' hf saves and its record of a save come from the adapter
        strategy = getattr(paddlenlp_args, "save_strategy", "no")
        saves = str(getattr(strategy, "value", strategy)) != "no"
        wants_adapter = door.resume_from_custom_func is not None or \
            (isinstance(door.recipe, PaddleFormersRecipe) and saves)
        if wants_adapter and self.callbacks.get(PaddleNLPCallbacks) is None:
            self.callbacks.add(PaddleNLPCallbacks())

        if self.is_main_process:  # PaddleNLP's Trainer makes output_dir at construction; scripts write into it
            with contextlib.suppress(OSError):  # a path that cannot be made is reported by fit() (trainer.checkpoint)
                os.makedirs(self.args.output_dir, exist_ok=True)

        if paddlenlp_args is not None and not self.args.report_to and self.callbacks.get(Rank0Logger) is None:
            # PaddleNLP's report_to names integrations only: its console (a progress bar, or a line per log with
            # disable_tqdm) is on whatever it says. Ours too, the console alone: no file, records as PaddleNLP's
            self.callbacks.add(Rank0Logger(report_to=["tqdm"]))
        handler = self.callbacks.get(PaddleNLPCallbacks)
        if handler is not None:
            handler.paddlenlp_args = paddlenlp_args
            handler.resume_from_custom_func = door.resume_from_custom_func
            handler.init_end(self)

    def _adapt(self, callback) -> list:
        from .door import adapt_callbacks

        return adapt_callbacks([callback], existing=list(self.callbacks))

    # ---- train -------------------------------------------------------------------------
    def train(self, resume_from_checkpoint=None, ignore_keys_for_eval=None, **kwargs):
        """PaddleNLP's ``train()``: ``fit()``, then a summary ``log``; returns a :class:`TrainOutput`."""
        from .outputs import TrainOutput

        if kwargs:
            from ..errors import ConfigError

            raise ConfigError(f"train() got unknown keywords {sorted(kwargs)}: it takes resume_from_checkpoint")
        if resume_from_checkpoint is True:
            resume_from_checkpoint = "auto"
        elif resume_from_checkpoint is False:
            resume_from_checkpoint = None
        tracker = _LossTotal()
        self.callbacks.add(tracker)
        self._in_train_api = True
        try:
            self.fit(resume_from_checkpoint=resume_from_checkpoint)
        finally:
            self._in_train_api = False
            self.callbacks.remove(tracker)
        from .. import distributed as dist

        # the mean over ranks, as PaddleNLP's (its logged losses are all-gathered means): one sync, at the end; under
        # pipeline parallel every stage first takes the last stage's sum (the others hold none)
        steps = tracker.window.steps
        total = dist.reduce_scalars([float(self.layout.share_loss(tracker.window.total())) if steps else 0.0])[0]
        loss = total / steps if steps else float("nan")
        metrics = {**self.state.train_metrics, "train_loss": loss}  # fit()'s names and values (trainer.state)
        s = self.state
        epoch = round(s.epoch + s.step_in_epoch / max(1, s.steps_per_epoch), 4)
        metrics["progress_or_epoch"] = epoch  # PaddleNLP's log() adds it to the metrics it is given
        self.log({"step": s.global_step, "epoch": epoch, **metrics})
        for handler in self._compat_handlers():
            handler.train_end(self)
        return TrainOutput(self.state.global_step, loss, metrics)

    def _compat_handlers(self):
        from .paddlenlp_callbacks import PaddleNLPCallbacks

        return [cb for cb in self.callbacks if isinstance(cb, PaddleNLPCallbacks)]

    # ---- files ---------------------------------------------------------------------------
    def save_model(self, output_dir: Optional[str] = None, merge_tensor_parallel: bool = False) -> str:
        """Write the model (and tokenizer) so that ``from_pretrained(output_dir)`` loads them; rank 0 only."""
        import paddle

        from .door import framework_of

        output_dir = output_dir or self.args.output_dir
        self.wait_for_checkpoint()
        if self.world_size > 1 and framework_of(self.model) == "paddleformers":
            self._save_on_every_rank(output_dir)
            return output_dir
        if self.is_main_process:
            fence.check(output_dir)  # only while output_dir is still this run's (no-op for a directory not held)
            os.makedirs(output_dir, exist_ok=True)
            if hasattr(self.model, "save_pretrained"):
                self.model.save_pretrained(output_dir)
            else:
                paddle.save(self.model.state_dict(), os.path.join(output_dir, "model_state.pdparams"))
            self._save_beside_model(output_dir)
        return output_dir

    def _save_on_every_rank(self, output_dir: str) -> None:
        """A PaddleFormers model on several processes. Its default save_pretrained format (flex_checkpoint) is
        collective and calls ``.cuda()`` there; its other format is not collective for a model, while a LoRA
        adapter's waits at a barrier after every rank wrote the same file. Every rank holds the whole model here
        (data parallel, sharding stage 1), so every rank calls it in that format: rank 0 into ``output_dir``
        (``model.safetensors``, a LoRA adapter's ``lora_model_state.pdparams``; ``from_pretrained`` loads
        either), the others into a scratch directory, removed."""
        import shutil
        import tempfile

        main = self.is_main_process
        if main:
            fence.check(output_dir)
            os.makedirs(output_dir, exist_ok=True)
        target = output_dir if main else tempfile.mkdtemp(prefix="pf-save-")
        try:
            self.model.save_pretrained(target, is_main_process=main, save_checkpoint_format="unified_checkpoint",
                                       safe_serialization=True)
        finally:
            if not main:
                shutil.rmtree(target, ignore_errors=True)
        if main:
            self._save_beside_model(output_dir)

    def _save_beside_model(self, output_dir: str) -> None:
        """The tokenizer, the processing class and our arguments, beside the saved model (rank 0)."""
        for obj in (self.tokenizer, self.processing_class):
            if obj is not None and hasattr(obj, "save_pretrained"):
                obj.save_pretrained(output_dir)
        with open(os.path.join(output_dir, "training_args.json"), "w", encoding="utf-8") as f:
            json.dump(self.args.to_dict(), f, indent=2, sort_keys=True, default=str)

    def save_hf_checkpoint(self) -> str:
        """PaddleFormers' hf checkpoint: ``save_model`` into ``<output_dir>/hf_checkpoint-<step>``."""
        return self.save_model(os.path.join(self.args.output_dir, f"hf_checkpoint-{self.state.global_step}"))

    def rotate_hf_checkpoints(self, limit: Optional[int]) -> list:
        """Keep the newest ``limit`` ``hf_checkpoint-<step>`` folders of ``output_dir`` and remove the older ones
        (PaddleFormers' ``save_hf_total_limit``, after each hf save, on each node's first process; None or <= 0:
        keep all). The folders removed, oldest first."""
        if not limit or limit <= 0 or not self.is_local_process_zero():
            return []
        root = self.args.output_dir
        steps = sorted(int(n.split("-", 1)[1]) for n in os.listdir(root)
                       if n.startswith("hf_checkpoint-") and n.split("-", 1)[1].isdigit()
                       and os.path.isdir(os.path.join(root, n)))
        removed = [os.path.join(root, f"hf_checkpoint-{s}") for s in steps[:max(0, len(steps) - int(limit))]]
        for path in removed:
            logger.info("removing the older hf checkpoint %s (save_hf_total_limit %d)", path, limit)
            shutil.rmtree(path, ignore_errors=True)  # a shared disk: another node's first process may be at it
        return removed

    def metrics_format(self, metrics: dict) -> dict:
        """Metrics for people: runtimes as h:mm:ss.ss, floats rounded to 4 places."""
        out = {}
        for key, value in metrics.items():
            if "_runtime" in key and isinstance(value, (int, float)):
                out[key] = str(datetime.timedelta(seconds=round(value, 2)))
            elif isinstance(value, float):
                out[key] = round(value, 4)
            else:
                out[key] = value
        return out

    def log_metrics(self, split: str, metrics: dict) -> None:
        """Log ``metrics`` as an aligned block under ``***** split metrics *****`` (rank 0)."""
        if not self.is_world_process_zero() or not metrics:
            return
        shown = self.metrics_format(metrics)
        kw, vw = max(len(str(k)) for k in shown), max(len(str(v)) for v in shown.values())
        logger.info("***** %s metrics *****", split)
        for key in sorted(shown):
            logger.info(f"  {key: <{kw}} = {shown[key]!s:>{vw}}")

    def save_metrics(self, split: str, metrics: dict, combined: bool = True) -> None:
        """``output_dir/<split>_results.json``, merged into ``all_results.json`` when ``combined`` (rank 0)."""
        if not self.is_world_process_zero():
            return
        os.makedirs(self.args.output_dir, exist_ok=True)
        _write_json(os.path.join(self.args.output_dir, f"{split}_results.json"), metrics)
        if combined:
            path = os.path.join(self.args.output_dir, "all_results.json")
            merged = {}
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    merged = json.load(f)
            merged.update(metrics)
            _write_json(path, merged)

    def save_state(self) -> None:
        """``output_dir/trainer_state.json``: the trainer state with PaddleNLP's key names added (rank 0)."""
        if not self.is_world_process_zero():
            return
        state = self.state.state_dict()
        state["best_model_checkpoint"] = state.get("best_checkpoint")
        for key, value in self._their_state_keys().items():  # their TrainerState's other keys, beside ours
            state.setdefault(key, value)
        os.makedirs(self.args.output_dir, exist_ok=True)
        _write_json(os.path.join(self.args.output_dir, "trainer_state.json"), state)

    def _their_state_keys(self) -> dict:
        """Keys of PaddleNLP's (and PaddleFormers') ``TrainerState`` that ours has not; PaddleFormers' adds
        ``consumed_samples``: the samples of the optimizer steps taken, over every rank."""
        keys = {"total_flos": 0, "is_local_process_zero": self.is_local_process_zero(),
                "is_world_process_zero": self.is_world_process_zero(), "trial_name": None, "trial_params": None}
        handler = next(iter(self._compat_handlers()), None)
        recipe = getattr(self, "recipe", None)
        if getattr(recipe, "name", None) == "paddleformers" or (handler is not None and handler.origin() == "paddleformers"):
            a = self.args
            keys["consumed_samples"] = self.state.global_step * a.per_device_train_batch_size * \
                a.gradient_accumulation_steps * self.layout.data_world_size
        return keys

    # ---- facts and callbacks -----------------------------------------------------------
    def is_world_process_zero(self) -> bool:
        return self.is_main_process

    def is_local_process_zero(self) -> bool:
        from .. import distributed as dist

        return dist.get_local_rank() == 0

    def _remove_adapted(self, callback) -> None:
        for cb in list(self.callbacks):
            pop = getattr(cb, "pop", None)
            if callable(pop):
                while pop(callback) is not None and isinstance(callback, type):
                    pass

    def pop_callback(self, callback):
        """Remove a callback (an instance or the first of a class) and return it; None when absent."""
        for cb in list(self.callbacks):
            pop = getattr(cb, "pop", None)
            if callable(pop):  # an adapter holding PaddleNLP or hapi callbacks
                found = pop(callback)
                if found is not None:
                    return found
            if cb is callback or (isinstance(callback, type) and isinstance(cb, callback)):
                self.callbacks.remove(cb)
                return cb
        return None


def _write_json(path: str, value) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=4, sort_keys=True, default=str)
    with fence.fenced(os.path.dirname(os.path.abspath(path))):  # only while output_dir is still this run's
        os.replace(tmp, path)
