"""The arguments room: every option of a run, with one name, one default and one place where it is validated.

Owns: :class:`TrainingArguments` (``arguments``: the fields, their checks, loading from YAML and the command
line, and the run's :class:`trainer.layout.Layout`, planned once when the fields are checked), the PaddleNLP
spellings turned into the project's one name per option (``aliases``), PaddleNLP's fields without an option of
their own here (``paddlenlp_fields``: a dataclass base of ``TrainingArguments``) and the migration tables of
PaddleNLP's fields (``fields_table``: data) and of PaddleFormers' (``paddleformers_fields``: data).

May import: ``trainer.errors``, ``trainer.device`` (the device choices), ``trainer.capabilities`` (what this build
can run, asked before anything is launched), ``trainer.layout`` (the parallel fields are planned together) and
``trainer.parallel`` (``init_topology``: fleet's groups before a tensor- or pipeline-parallel model is built);
paddle only inside functions. Never the compat room (it converts PaddleNLP's arguments into these), the loop,
checkpoints, callbacks or models.

Used by: ``trainer.trainer``, ``trainer.compat`` (PaddleNLP's arguments converted into these, the migration
table), ``trainer.cli`` and scripts (``from trainer import TrainingArguments``).

Importing the package costs no paddle import.
"""

from .aliases import DEFAULT_REPORTERS, REPORTERS, TRACKERS
from .arguments import (AMP_CHOICES, AMP_LEVELS, DATA_FINGERPRINTS, DEVICES, OPTIMIZERS, SCHEDULERS, STRATEGIES,
                        TrainingArguments, coerce_fields, load_yaml_mapping, parse_overrides)

__all__ = ["AMP_CHOICES", "AMP_LEVELS", "DATA_FINGERPRINTS", "DEFAULT_REPORTERS", "DEVICES", "OPTIMIZERS", "REPORTERS",
           "SCHEDULERS", "STRATEGIES", "TRACKERS", "TrainingArguments", "coerce_fields", "load_yaml_mapping",
           "parse_overrides"]
