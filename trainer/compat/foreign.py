"""The base of the two callback adapters (PaddleNLP's, paddle's hapi): a list of
another framework's callbacks, membership as their handlers keep it, and one
call that names the foreign callback and its hook when it fails."""

from __future__ import annotations

from typing import Any, List

from callbacks.base import Callback
from trainer.errors import CallbackError, TrainerError


class ForeignCallbacks(Callback):
    def __init__(self):
        self.callbacks: List[Any] = []

    @staticmethod
    def instance(callback):
        """A callback given as its class is made with no arguments, as both handlers do."""
        return callback() if isinstance(callback, type) else callback

    def pop(self, callback):
        """Remove and return the first callback that is ``callback`` or an instance of it (a class); else None."""
        for cb in self.callbacks:
            if cb is callback or (isinstance(callback, type) and isinstance(cb, callback)):
                self.callbacks.remove(cb)
                return cb
        return None

    @staticmethod
    def invoke(cb, hook: str, *args, **kwargs):
        """``cb.hook(...)``; an unexpected error names the foreign callback and its hook, not the adapter."""
        try:
            return getattr(cb, hook)(*args, **kwargs)
        except TrainerError:
            raise
        except Exception as exc:
            raise CallbackError(type(cb).__name__, hook[3:], exc) from exc
