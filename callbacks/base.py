"""Callback, the base class users subclass, and CallbackList, which runs them.

A callback implements ``on_<event>(self, trainer)`` for the events it cares
about (see ``trainer.events.EVENT_TABLE``); every other hook is a no-op and is
never even called: CallbackList precomputes, per event, the callbacks that
override it, and whose :meth:`Callback.wants` does not decline it (asked when
the callback joins, and again after ``on_fit_begin`` and after ``on_fit_end``:
a per-step dispatch costs ~1 us on an idle core and ~10 us on a crowded one,
against a 0.36 ms step of the tiny MLP in ``benchmarks/overhead``). Callbacks
run in ascending ``order`` (ties: the order they were given in)::

    >>> class CountSteps(Callback):
    ...     order = 50
    ...     def __init__(self):
    ...         self.steps = 0
    ...     def on_step_end(self, trainer):
    ...         self.steps += 1
    ...     def state_dict(self):
    ...         return {"steps": self.steps}
    ...     def load_state_dict(self, state):
    ...         self.steps = state["steps"]
    >>> CountSteps().state_key
    'CountSteps'

A method named ``on_*`` that is no event (``on_step_ends``) would never be
called: adding such a callback logs a warning (logger ``callbacks``) naming the
method and the closest event (see :func:`unknown_hooks`).
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import time
from collections import defaultdict
from typing import Any, Iterable, List, Optional

from trainer.errors import CallbackError, ConfigError, TrainerError
from trainer.events import Event

logger = logging.getLogger("callbacks")

EVENT_METHODS = tuple(event.method for event in Event)


class Callback:
    """Base class of every callback: a no-op method per event.

    Attributes:
        order: lower runs first. Built-ins use: 0 AMP/NaN guard (they change the
            loss and gradients), 10 LR schedule, 20 flow control, 50 user default,
            90 monitors (add figures to ``state.logs``), 100 loggers, 200 checkpoint.
    """

    order: int = 50

    @property
    def state_key(self) -> str:
        """Key of this callback's state in checkpoints; unique per trainer."""
        return type(self).__name__

    def state_dict(self) -> dict:
        """JSON-serialisable state saved in checkpoints (tensors: return numpy arrays)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""

    def wants(self, hook: str) -> bool:
        """Whether ``hook`` (an event method such as ``"on_step_end"``) has work to do in this
        callback's current configuration. A hook it declines is not dispatched until the next time
        the list asks: when the callback joins, after ``on_fit_begin`` and after ``on_fit_end``
        (e.g. ``Rank0Logger`` declines ``on_step_end`` when there is no progress bar to advance).
        Default: every hook the class overrides."""
        return True

    def forward_context(self, trainer) -> Optional[contextlib.AbstractContextManager]:
        """A context entered around every forward pass (AMP: auto_cast), or None."""
        return None

    # one no-op per event ------------------------------------------------
    def on_fit_begin(self, trainer): ...
    def on_epoch_begin(self, trainer): ...
    def on_step_begin(self, trainer): ...
    def on_backward_begin(self, trainer): ...
    def on_backward_end(self, trainer): ...
    def on_optimizer_step_begin(self, trainer): ...
    def on_optimizer_step_end(self, trainer): ...
    def on_step_end(self, trainer): ...
    def on_log(self, trainer): ...
    def on_epoch_end(self, trainer): ...
    def on_eval_begin(self, trainer): ...
    def on_eval_step_begin(self, trainer): ...
    def on_eval_step_end(self, trainer): ...
    def on_eval_end(self, trainer): ...
    def on_predict_begin(self, trainer): ...
    def on_predict_end(self, trainer): ...
    def on_save_begin(self, trainer): ...
    def on_save_end(self, trainer): ...
    def on_load_begin(self, trainer): ...
    def on_load_end(self, trainer): ...
    def on_exception(self, trainer): ...
    def on_fit_end(self, trainer): ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}(order={self.order})"


def unknown_hooks(callback: Callback) -> List[str]:
    """``on_*`` methods of ``callback``'s class that are no event, each with a hint.

    >>> class Typo(Callback):
    ...     def on_step_ends(self, trainer): ...
    >>> unknown_hooks(Typo())
    ["on_step_ends is not an event and will never be called (did you mean 'on_step_end'?)"]
    """
    out = []
    for name in sorted(dir(type(callback))):
        if not name.startswith("on_") or name in EVENT_METHODS or not callable(getattr(type(callback), name, None)):
            continue
        close = difflib.get_close_matches(name, EVENT_METHODS, n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else f": events are {', '.join(EVENT_METHODS)}"
        out.append(f"{name} is not an event and will never be called{hint}")
    return out


def _overrides(callback: Callback, method: str) -> bool:
    return getattr(type(callback), method, None) is not getattr(Callback, method)


class CallbackList:
    """An ordered set of callbacks and the one dispatcher, :meth:`fire`.

    ``fire`` wraps any unexpected exception in :class:`CallbackError` naming the
    callback and the event (the project's own errors, raised on purpose, keep
    their type and exit code), and times every call (``timings``: seconds per
    (callback, event), by ``CallbackList.clock``, default ``time.perf_counter``;
    ``benchmarks/overhead --callback-cpu`` sets ``time.thread_time`` to count the
    training thread's CPU only), so overhead is visible in benchmarks and
    ``describe()``.
    """

    clock = staticmethod(time.perf_counter)

    def __init__(self, callbacks: Iterable[Callback] = ()):
        self._callbacks: List[Callback] = []
        for cb in callbacks:
            self.add(cb, _rebuild=False)
        self._rebuild()

    # ---- membership ----------------------------------------------------
    def add(self, callback: Callback, _rebuild: bool = True) -> None:
        if isinstance(callback, type):
            raise ConfigError(f"callback {callback.__name__} was given as a class: pass an instance, {callback.__name__}()")
        if not isinstance(callback, Callback):
            raise ConfigError(f"{callback!r} is not a callbacks.Callback: subclass callbacks.Callback")
        key = callback.state_key
        if any(cb.state_key == key for cb in self._callbacks):
            raise ConfigError(f"two callbacks share the state_key {key!r}: remove one, or give each a distinct state_key")
        for problem in unknown_hooks(callback):
            logger.warning("callback %s: %s", type(callback).__name__, problem)
        self._callbacks.append(callback)
        if _rebuild:
            self._rebuild()

    def remove(self, callback_or_type: Any) -> None:
        """Remove an instance, or every instance of a class."""
        self._callbacks = [cb for cb in self._callbacks
                           if not (cb is callback_or_type or (isinstance(callback_or_type, type) and isinstance(cb, callback_or_type)))]
        self._rebuild()

    def get(self, cls: type) -> Optional[Callback]:
        """The first callback that is an instance of ``cls``, or None."""
        return next((cb for cb in self._callbacks if isinstance(cb, cls)), None)

    def __iter__(self):
        return iter(self._ordered)

    def __len__(self) -> int:
        return len(self._callbacks)

    def _rebuild(self) -> None:
        # stable sort: ties keep the order given
        self._ordered = sorted(self._callbacks, key=lambda cb: cb.order)
        self._refresh()
        self._contexts = [cb for cb in self._ordered if _overrides(cb, "forward_context")]
        self.timings = defaultdict(float)

    def _refresh(self) -> None:
        """The handlers per event: the hooks each callback overrides and wants now."""
        self._handlers = {  # (callback, bound hook, its key in timings)
            event: [(cb, getattr(cb, event.method), (type(cb).__name__, event.value)) for cb in self._ordered
                    if _overrides(cb, event.method) and cb.wants(event.method)]
            for event in Event
        }

    # ---- dispatch ------------------------------------------------------
    def fire(self, event: Event, trainer) -> None:
        clock = self.clock
        for cb, method, key in self._handlers[event]:
            start = clock()
            try:
                method(trainer)
            except TrainerError:  # deliberate errors (CallbackError included) keep their type and exit code
                raise
            except Exception as exc:
                raise CallbackError(key[0], key[1], exc) from exc
            finally:
                self.timings[key] += clock() - start
        if event is Event.FIT_BEGIN or event is Event.FIT_END:  # what a callback wants may have changed
            self._refresh()

    def has_handlers(self, event: Event) -> bool:
        return bool(self._handlers[event])

    def handlers(self, event: Event) -> List[Callback]:
        """The callbacks ``fire(event)`` calls now, in order."""
        return [cb for cb, _, _ in self._handlers[event]]

    def forward_context(self, trainer) -> contextlib.AbstractContextManager:
        """All callbacks' forward contexts, entered in order."""
        if not self._contexts:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        for cb in self._contexts:
            try:
                ctx = cb.forward_context(trainer)
            except Exception as exc:
                stack.close()
                raise CallbackError(type(cb).__name__, "forward_context", exc) from exc
            if ctx is not None:
                stack.enter_context(ctx)
        return stack

    # ---- state -----------------------------------------------------------
    def state_dict(self) -> dict:
        return {cb.state_key: cb.state_dict() for cb in self._ordered}

    def load_state_dict(self, states: dict) -> List[str]:
        """Restore each callback's state; return the keys nobody claimed that hold state (an empty state,
        e.g. StallWatchdog's of a run on more processes, is nothing lost)."""
        by_key = {cb.state_key: cb for cb in self._ordered}
        for key, state in states.items():
            if key in by_key:
                try:
                    by_key[key].load_state_dict(state)
                except Exception as exc:
                    raise CallbackError(type(by_key[key]).__name__, "load_state_dict", exc) from exc
        return [key for key in states if key not in by_key and states[key]]

    # ---- introspection ---------------------------------------------------
    def describe(self) -> str:
        """The callbacks per event, in the order they will run."""
        lines = ["callbacks (order, name):"]
        for cb in self._ordered:
            note = getattr(cb, "note", None)
            lines.append(f"  {cb.order:>4}  {type(cb).__name__}" + (f" ({note()})" if callable(note) else ""))
        lines.append("per event, in run order:")
        for event in Event:
            names = [type(cb).__name__ for cb, _, _ in self._handlers[event]]
            if names:
                lines.append(f"  on_{event.value:<22} {' -> '.join(names)}")
        if self._contexts:
            lines.append(f"  {'forward_context':<25} {' -> '.join(type(cb).__name__ for cb in self._contexts)}")
        if self.timings:
            lines.append("time spent (ms):")
            for (name, event), secs in sorted(self.timings.items(), key=lambda kv: -kv[1]):
                lines.append(f"  {name}.on_{event}: {secs * 1e3:.3f}")
        return "\n".join(lines)
