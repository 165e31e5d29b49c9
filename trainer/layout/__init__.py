"""The layout room: which part of the model each rank holds, and how the parts make the whole model.

Owns: the :class:`Layout` (``plan``: degrees, ranks, groups, planned once from the arguments, and the questions
the loop, checkpoints and export ask it instead of reading degrees: ``local_state``, ``whole_state``,
``saved_blocks``, ``whole_model``), the parameters paddle holds in pieces (``slices``: sharding stage 3's flat
ranges, tensor parallel's blocks at their offsets), a pipeline stage's names in the whole model (``stages``) and
the single-card twin a tensor-parallel model's slices are gathered into (``merge``), and a LoRA adapter around the
model (``adapters``: described for checkpoints, its state set under the wrapper's names, merged into its base for
export).

May import: paddle and numpy (``slices``, ``stages``, ``merge``, ``adapters``: imported by name where used),
``trainer.errors``, ``trainer.distributed``, ``trainer.tensors``. Never the parallel, checkpoint or deploy rooms
(they ask it), the loop, callbacks or models.

Used by: ``trainer.args`` (the fields are checked together by :meth:`Layout.plan`), ``trainer.capabilities``,
``trainer.trainer`` (``trainer.layout``), ``trainer.parallel`` (applies it and fills its groups),
``trainer.checkpoint`` (what a save writes and a resume loads) and ``trainer.deploy`` (the model an export writes).

Importing the package costs no paddle import (``trainer.args`` plans the layout, and ``ptrain inspect`` and
``trainer.capabilities`` read it without paddle): ``plan`` is plain Python and imports paddle only inside the
methods that act on a model.
"""

from .plan import Layout, parse_sharding

__all__ = ["Layout", "parse_sharding"]
