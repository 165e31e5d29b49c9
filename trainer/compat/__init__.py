"""Compatibility with PaddleNLP's and PaddleFormers' Trainers and paddle's hapi callbacks:
the one place where their names are translated into this project's.

Owns:

- ``door``: ``Trainer(...)``'s PaddleNLP and PaddleFormers keywords and objects, at construction;
- ``args_convert``: paddlenlp (or paddleformers) ``TrainingArguments`` -> ours (by the migration tables,
  ``trainer.args.fields_table`` and ``trainer.args.paddleformers_fields``); ``table``: those tables as Markdown
  (``python -m trainer.compat.table [paddleformers]``);
- ``outputs``: ``TrainOutput``, ``PredictionOutput``, ``EvalPrediction``
  (named tuples);
- ``api``: ``train``, ``save_model``, ``log_metrics``, ``save_metrics``,
  ``save_state``, ``is_world_process_zero``, ``pop_callback`` (a mixin of
  ``trainer.Trainer``);
- ``paddlenlp_recipe``: PaddleNLP's arithmetic (schedule, clip, decay) for a run
  given PaddleNLP's arguments; ``paddleformers_recipe``: PaddleFormers' (its data order,
  ``min_lr``, its log record), for a run given PaddleFormers' arguments;
- ``paddlenlp_callbacks``, ``hapi_callbacks``: the callback adapters (their common base in ``foreign``).

PaddleNLP's fields without an option here are ``trainer.args.paddlenlp_fields``
(a dataclass base of ``TrainingArguments``): the arguments sit below this room.

May import: ``trainer.args`` (the arguments PaddleNLP's are converted into),
``trainer.errors``, ``trainer.distributed``, ``trainer.recipe`` (the recipe PaddleNLP's
extends), ``trainer.loss`` (``train()``'s loss summed on the device), ``trainer.data`` (a batch's size), ``trainer.checkpoint`` (``fence``:
``save_model`` writes into the run's output_dir) and ``callbacks`` (``callbacks.base``:
the adapters are callbacks). Never the loop itself or models.

Used by: ``trainer.trainer`` (``door``, ``api``), ``trainer.evaluation`` and
``trainer`` (``outputs``' named tuples) and PaddleNLP and PaddleFormers users' scripts (``trainer.sft``
reaches it through ``Trainer``).

The training loop never sees a PaddleNLP or PaddleFormers name. Nothing here imports paddlenlp
(or paddleformers) until such an object is given. Guides: docs/how-to/migrate-paddlenlp.md,
docs/how-to/migrate-paddleformers.md, docs/how-to/migrate-hapi.md.
"""

from .outputs import EvalPrediction, PredictionOutput, TrainOutput

__all__ = ["EvalPrediction", "PredictionOutput", "TrainOutput"]
