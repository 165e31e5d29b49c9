"""DynamicLossScaler: float16 loss scaling whose bookkeeping stays on the device.

It has the interface of ``paddle.amp.GradScaler`` (``scale``, ``unscale_``,
``step``, ``update``, ``state_dict``, ``load_state_dict``), so the trainer's
``grad_scaler`` seam drives it unchanged, and adds what the callbacks need:

- ``skip_if(flag)``: also skip this step when a device flag is true (the NaN
  guard hands in its non-finite-loss flag);
- ``last_found_inf``: the device flag of the last step (true = skipped);
- ``take_skipped()``: skipped steps since the last call (reads the device: call
  it at logging intervals only).

Why our own and not ``paddle.amp.GradScaler``: paddle's refuses to enable
off-GPU (so its float16 path could not be tested on a CPU machine), keeps the
overflow flag in private attributes (so skipped steps could not be counted),
and prints to stdout with a ``float(scale)`` sync on every backoff. This one
runs the same code on every device.

Host syncs: the scale, the counters and the skip count are device tensors
updated with device ops. Skipping the update is handed to paddle through the
optimizer's ``found_inf`` auxiliary variable (what paddle's own GradScaler
does); paddle 3.3 in dygraph reads that flag on the host inside
``Optimizer.step`` (``if found_inf:`` in ``_create_optimization_pass``), which
is the one device-to-host sync per optimizer step that skipping costs
(PyTorch's GradScaler pays the same one). An optimizer without that variable
is stepped behind an explicit host check: the same single sync.

Unscaling runs paddle's fused ``check_finite_and_unscale_`` kernel (from
``paddle._C_ops``, as paddle's GradScaler does: one launch per dtype), and a
per-gradient fallback where that kernel is missing (float16 on a CPU).

    >>> import paddle
    >>> model = paddle.nn.Linear(2, 1)
    >>> opt = paddle.optimizer.AdamW(parameters=model.parameters())
    >>> scaler = DynamicLossScaler(init_loss_scaling=8.0, parameters=model.parameters())
    >>> scaler.scale(model(paddle.ones([1, 2])).sum()).backward()
    >>> scaler.unscale_(opt)         # true gradients from here on (clip them now)
    >>> scaler.step(opt); scaler.update(); opt.clear_grad()
    >>> scaler.get_loss_scaling()    # reads the device: not in the hot path
    8.0
"""

from __future__ import annotations

import enum
from typing import Iterable, List, Optional

import paddle

from trainer import distributed as dist


class _Stage(enum.Enum):
    READY = "ready"          # gradients are still scaled
    UNSCALED = "unscaled"    # unscale_() ran: gradients are true, found_inf known
    STEPPED = "stepped"      # step() ran; update() comes next


def nonfinite_flag(tensors: Iterable[paddle.Tensor]) -> paddle.Tensor:
    """A device bool scalar: true when any element of ``tensors`` is nan or inf (no host sync)."""
    flags = [paddle.logical_not(paddle.isfinite(t).all()) for t in tensors]
    if not flags:
        return paddle.zeros([], dtype="bool")
    return flags[0] if len(flags) == 1 else paddle.stack(flags).any()


# paddle's fused kernel (the one paddle.amp.GradScaler runs): one launch per dtype instead of
# three per gradient, which matters for models with hundreds of parameter tensors. On a CPU
# paddle registers it for float32/float64 only.
FUSED_UNSCALE = getattr(getattr(paddle, "_C_ops", None), "check_finite_and_unscale_", None)


@paddle.no_grad()
def unscale_and_check(grads: List[paddle.Tensor], scale: paddle.Tensor) -> paddle.Tensor:
    """Divide ``grads`` by ``scale`` (a float32 device scalar) in place; return a device bool
    scalar, true if any gradient holds nan or inf. No host sync."""
    by_dtype: dict = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    on_cpu = paddle.get_device().startswith("cpu")
    flags = []
    for dtype, group in by_dtype.items():
        if FUSED_UNSCALE is not None and (not on_cpu or dtype in (paddle.float32, paddle.float64)):
            flags.append(FUSED_UNSCALE(group, scale.reshape([1]))[1].reshape([]))
        else:
            flags.append(_unscale_and_check_each(group, scale))
    if not flags:
        return paddle.zeros([], dtype="bool")
    return flags[0] if len(flags) == 1 else paddle.stack(flags).any()


def _unscale_and_check_each(grads: List[paddle.Tensor], scale: paddle.Tensor) -> paddle.Tensor:
    found = nonfinite_flag(grads)
    inv = 1.0 / scale
    for g in grads:
        if g.dtype == paddle.float32:
            g.multiply_(inv)
        else:  # low-precision gradients are unscaled in float32: 1/scale may be below their range
            paddle.assign((g.astype("float32") * inv).astype(g.dtype), output=g)
    return found


class DynamicLossScaler:
    """Multiply the loss by ``scale`` before backward, divide the gradients by it
    before the update, skip updates whose gradients are not finite.

    With ``use_dynamic_loss_scaling`` the scale is multiplied by ``decr_ratio``
    after ``decr_every_n_nan_or_inf`` consecutive non-finite steps and by
    ``incr_ratio`` after ``incr_every_n_steps`` consecutive finite ones
    (paddle's rules; a growth that would overflow float32 is not applied).

    Args:
        parameters: the parameters whose gradients are unscaled and checked
            (default: the optimizer's parameter list).
        check_gradients: look for nan/inf in the gradients (False: only the
            flags given to :meth:`skip_if` decide).

    ``agree_across_ranks`` (set by ``trainer.parallel`` under sharding, where each rank holds its own
    unreduced gradients until the optimizer step reduces them): the step's non-finite flag is summed
    over all ranks (one device collective a step), so every rank skips the same steps.
    """

    def __init__(self, init_loss_scaling: float = 2.0 ** 15, incr_ratio: float = 2.0, decr_ratio: float = 0.5,
                 incr_every_n_steps: int = 2000, decr_every_n_nan_or_inf: int = 1,
                 use_dynamic_loss_scaling: bool = True, parameters: Optional[Iterable[paddle.Tensor]] = None,
                 check_gradients: bool = True):
        if not init_loss_scaling > 0:
            raise ValueError(f"init_loss_scaling={init_loss_scaling!r}: must be > 0")
        if not incr_ratio > 1:
            raise ValueError(f"incr_ratio={incr_ratio!r}: must be > 1")
        if not 0 < decr_ratio < 1:
            raise ValueError(f"decr_ratio={decr_ratio!r}: must be in (0, 1)")
        if incr_every_n_steps < 1 or decr_every_n_nan_or_inf < 1:
            raise ValueError("incr_every_n_steps and decr_every_n_nan_or_inf must be integers >= 1")
        self.init_loss_scaling = float(init_loss_scaling)
        self.incr_ratio, self.decr_ratio = float(incr_ratio), float(decr_ratio)
        self.incr_every_n_steps, self.decr_every_n_nan_or_inf = int(incr_every_n_steps), int(decr_every_n_nan_or_inf)
        self.use_dynamic_loss_scaling = bool(use_dynamic_loss_scaling)
        self.check_gradients = bool(check_gradients)
        self.parameters: Optional[List[paddle.Tensor]] = list(parameters) if parameters is not None else None
        # device state (float32 / int64 scalars)
        self._scale = paddle.full([], self.init_loss_scaling, dtype="float32")
        self._incr_count = paddle.zeros([], dtype="int64")   # consecutive finite steps
        self._decr_count = paddle.zeros([], dtype="int64")   # consecutive non-finite steps
        self._skipped = paddle.zeros([], dtype="int64")      # skipped steps since take_skipped()
        self.last_found_inf = paddle.zeros([], dtype="bool")
        self._found_inf = paddle.zeros([], dtype="bool")
        self._extra: List[paddle.Tensor] = []
        self._stage = _Stage.READY
        self.agree_across_ranks = False

    # ---- paddle.amp.GradScaler's interface --------------------------------------------
    def is_enable(self) -> bool:
        return True

    def is_use_dynamic_loss_scaling(self) -> bool:
        return self.use_dynamic_loss_scaling

    def scale(self, loss: paddle.Tensor) -> paddle.Tensor:
        """``loss * scale`` in float32 (device op)."""
        if loss.dtype != paddle.float32:
            loss = loss.astype("float32")
        return loss * self._scale

    @paddle.no_grad()
    def unscale_(self, optimizer=None) -> None:
        """Divide the gradients by the scale in place and look for nan/inf (device ops).

        Call once per optimizer step, after the last backward and before clipping.
        """
        if self._stage is _Stage.UNSCALED:
            raise RuntimeError("unscale_() was already called for this step; call update() after step()")
        if self._stage is _Stage.STEPPED:
            raise RuntimeError("unscale_() was called after step(): call update() first")
        grads = [p.grad for p in self._params(optimizer) if p.grad is not None]
        if self.check_gradients or self.use_dynamic_loss_scaling or self.init_loss_scaling != 1.0:
            found = unscale_and_check(grads, self._scale)  # a scale of 1 divides exactly
            self._found_inf = found if self.check_gradients else paddle.zeros([], dtype="bool")
        else:
            self._found_inf = paddle.zeros([], dtype="bool")
        self._stage = _Stage.UNSCALED

    def skip_if(self, flag: paddle.Tensor) -> None:
        """Also skip this step when the device bool ``flag`` is true (reset by update())."""
        self._extra.append(flag.astype("bool").reshape([]))

    def step(self, optimizer) -> None:
        """Update the parameters unless this step's gradients (or a :meth:`skip_if` flag) are not finite."""
        if self._stage is _Stage.STEPPED:
            raise RuntimeError("step() was already called for this step; call update() first")
        if self._stage is _Stage.READY:
            self.unscale_(optimizer)
        found = self._found_inf
        for flag in self._extra:
            found = paddle.logical_or(found, flag)
        if self.agree_across_ranks:
            found = dist.all_reduce_sum(found.astype("int32")) > 0
        if hasattr(optimizer, "_set_auxiliary_var"):
            # paddle's skip protocol (as in paddle.amp.GradScaler): the optimizer leaves
            # parameters, moments and beta powers untouched when found_inf is true.
            # paddle 3.3 dygraph reads the flag on the host here: the step's one sync.
            optimizer._set_auxiliary_var("found_inf", found)
            try:
                optimizer.step()
            finally:
                # paddle leaves a host bool behind; a stale True would skip later plain steps
                optimizer._set_auxiliary_var("found_inf", None)
        elif not bool(found):  # a CPU-GPU sync point: the same single one, made explicit
            optimizer.step()
        self.last_found_inf = found
        self._skipped = self._skipped + found.astype("int64")
        self._stage = _Stage.STEPPED

    @paddle.no_grad()
    def update(self) -> None:
        """Back off or grow the scale after a step (device ops, no sync)."""
        if self._stage is not _Stage.STEPPED:
            raise RuntimeError("update() must follow step()")
        if self.use_dynamic_loss_scaling:
            found = self.last_found_inf.astype("int64")
            self._decr_count = (self._decr_count + 1) * found
            self._incr_count = (self._incr_count + 1) * (1 - found)
            decr = self._decr_count >= self.decr_every_n_nan_or_inf
            incr = self._incr_count >= self.incr_every_n_steps
            grown = self._scale * self.incr_ratio
            grown = paddle.where(paddle.isfinite(grown), grown, self._scale)
            self._scale = paddle.where(decr, self._scale * self.decr_ratio, paddle.where(incr, grown, self._scale))
            zero = paddle.zeros([], dtype="int64")
            self._decr_count = paddle.where(decr, zero, self._decr_count)
            self._incr_count = paddle.where(incr, zero, self._incr_count)
        self._reset_step()

    def discard_step(self) -> None:
        """Forget this step's flags without stepping (the trainer skipped it on a host flag)."""
        self.last_found_inf = paddle.zeros([], dtype="bool")
        self._reset_step()

    def _reset_step(self) -> None:
        self._found_inf = paddle.zeros([], dtype="bool")
        self._extra = []
        self._stage = _Stage.READY

    @property
    def stage(self) -> str:
        """``ready`` (gradients scaled), ``unscaled`` or ``stepped``."""
        return self._stage.value

    # ---- reads (host syncs: logging intervals and checkpoints only) --------------------
    def get_loss_scaling(self) -> float:
        return float(self._scale)

    def take_skipped(self) -> int:
        """Steps skipped since the last call; resets the device counter."""
        n = int(self._skipped)
        self._skipped = paddle.zeros([], dtype="int64")
        return n

    def state_dict(self) -> dict:
        """JSON-able: the scale and the growth/backoff counters, with the configuration for reference."""
        return {
            "scale": float(self._scale),
            "incr_count": int(self._incr_count),
            "decr_count": int(self._decr_count),
            "incr_ratio": self.incr_ratio,
            "decr_ratio": self.decr_ratio,
            "incr_every_n_steps": self.incr_every_n_steps,
            "decr_every_n_nan_or_inf": self.decr_every_n_nan_or_inf,
            "use_dynamic_loss_scaling": self.use_dynamic_loss_scaling,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the scale and counters (also from ``paddle.amp.GradScaler.state_dict()``).

        The configuration (ratios, intervals) stays as constructed: this run's options win.
        """
        if not state:
            return
        scale = state["scale"]
        if not isinstance(scale, (int, float)):  # paddle stores a 1-element array
            scale = float(paddle.to_tensor(scale).reshape([-1])[0])
        self._scale = paddle.full([], float(scale), dtype="float32")
        self._incr_count = paddle.full([], int(state.get("incr_count", 0)), dtype="int64")
        self._decr_count = paddle.full([], int(state.get("decr_count", 0)), dtype="int64")

    # ---- helpers -----------------------------------------------------------------------
    def _params(self, optimizer) -> List[paddle.Tensor]:
        if self.parameters is not None:
            return self.parameters
        if optimizer is None:
            raise ValueError("DynamicLossScaler needs parameters=... or an optimizer to find the gradients")
        return list(getattr(optimizer, "_parameter_list", None) or [])
