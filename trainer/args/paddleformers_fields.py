"""The migration table of PaddleFormers' ``TrainingArguments`` (paddleformers 1.2): for every field of its
dataclass, how it maps here (``FIELDS``: name -> (kind, note)), and the fields PaddleFormers renamed from
PaddleNLP's (``RENAMED``: PaddleFormers' name -> ours).

Kinds as in ``trainer.args.fields_table`` (PaddleNLP's table): ``same``, ``renamed``, ``default``, ``ignored``,
``unsupported``. Data only, importing nothing but that table: read by ``trainer.compat.args_convert`` (the
conversion) and ``trainer.compat.table`` (docs/how-to/migrate-paddleformers.md).
"""

from typing import Dict, Tuple

from .fields_table import FIELDS as PADDLENLP_FIELDS

#: PaddleFormers' names of PaddleNLP's parallel fields -> ours (PaddleNLP's)
RENAMED: Dict[str, str] = {
    "tensor_model_parallel_size": "tensor_parallel_degree",
    "pipeline_model_parallel_size": "pipeline_parallel_degree",
    "sharding_parallel_size": "sharding_parallel_degree",
    "sep_parallel_size": "sep_parallel_degree",
}

# seed: PaddleNLP's rows for the fields both have; every other field is filled in by the table's owner
FIELDS: Dict[str, Tuple[str, str]] = {
    **{name: row for name, row in PADDLENLP_FIELDS.items()},
    **{name: ("renamed", ours) for name, ours in RENAMED.items()},
}
