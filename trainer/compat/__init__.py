"""Compatibility with PaddleNLP's Trainer and paddle's hapi callbacks: the one
place where their names are translated into this project's.

- ``door``: ``Trainer(...)``'s PaddleNLP keywords and objects, at construction;
- ``args_convert``: paddlenlp ``TrainingArguments`` -> ours; ``fields_table``: the
  migration table (``FIELDS``; ``python -m trainer.compat.table`` prints it as Markdown);
- ``paddlenlp_fields``: PaddleNLP's fields without an option here, with PaddleNLP's
  names, types and defaults (a dataclass base of ``trainer.TrainingArguments``);
- ``outputs``: ``TrainOutput``, ``PredictionOutput``, ``EvalPrediction``
  (named tuples);
- ``api``: ``train``, ``save_model``, ``log_metrics``, ``save_metrics``,
  ``save_state``, ``is_world_process_zero``, ``pop_callback`` (a mixin of
  ``trainer.Trainer``);
- ``paddlenlp_callbacks``, ``hapi_callbacks``: the callback adapters (their common base in ``foreign``).

The training loop never sees a PaddleNLP name. Nothing here imports paddlenlp
until a paddlenlp object is given. Guides: docs/how-to/migrate-paddlenlp.md,
docs/how-to/migrate-hapi.md.
"""

from .outputs import EvalPrediction, PredictionOutput, TrainOutput

__all__ = ["EvalPrediction", "PredictionOutput", "TrainOutput"]
