"""Callbacks for :class:`trainer.Trainer`: subclass :class:`Callback` to write your own.

Importing this package is light: it imports neither paddlenlp nor the
optional writers (VisualDL, matplotlib), which load when first used.
"""

from .base import Callback, CallbackList
from .defaults import default_callbacks
from .flow import FlowControl
from .logger import Rank0Logger

__all__ = ["Callback", "CallbackList", "FlowControl", "Rank0Logger", "default_callbacks"]
