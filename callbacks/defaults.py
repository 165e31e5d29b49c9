"""The default callback set: the one place where ``TrainingArguments`` switch
built-in callbacks on.

=================  ===========================================  ======
callback           switched on by                               order
=================  ===========================================  ======
FlowControl        always (turns intervals into state flags)    20
Rank0Logger        ``report_to`` not empty                      100
=================  ===========================================  ======

Pass ``Trainer(callbacks=[...])`` to add more; ``trainer.remove_callback(T)``
to drop one; subclass and replace to change a policy.
"""

from __future__ import annotations

from typing import List

from .base import Callback
from .flow import FlowControl
from .logger import Rank0Logger


def default_callbacks(args) -> List[Callback]:
    out: List[Callback] = [FlowControl()]
    if args.report_to:
        out.append(Rank0Logger())
    return out
