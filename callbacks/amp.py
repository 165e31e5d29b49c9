"""AMP: mixed precision with ``paddle.amp.auto_cast`` and, for float16, dynamic loss scaling.

Events and what happens there:

- ``forward_context``: ``paddle.amp.auto_cast(level, dtype)`` around every
  forward pass (training and evaluation).
- ``on_fit_begin``: level O2 decorates the model and the optimizer with
  ``paddle.amp.decorate`` (low-precision weights, float32 master weights in the
  optimizer); for float16, a :class:`callbacks.loss_scaler.DynamicLossScaler`
  becomes ``trainer.grad_scaler``, so the trainer steps through it.
- ``on_backward_begin``: ``state.loss`` becomes the scaled loss (every
  micro-batch: gradient accumulation sums scaled gradients).
- ``on_optimizer_step_begin``: gradients are unscaled once per optimizer step,
  before the trainer clips them, so clipping and ``grad_norm`` see true values.
- ``on_log``: adds ``loss_scale`` and ``amp_skipped_steps`` (overflow steps
  whose update was skipped) to the training record and folds the skipped steps
  into ``state.skipped_steps``; ``on_save_begin`` and ``on_fit_end`` fold too.

Options: ``dtype`` (``float16`` | ``bfloat16``; ``fp16`` / ``bf16`` accepted),
``level`` (``O1``: white-listed ops run in low precision; ``O2``: almost all,
with float32 master weights), the loss scaler's ``init_loss_scaling``,
``incr_ratio``, ``decr_ratio``, ``incr_every_n_steps``,
``decr_every_n_nan_or_inf``, ``use_dynamic_loss_scaling``, paddle's
``custom_white_list`` / ``custom_black_list``, and ``loss_scaling``: None (loss
scaling for float16 where paddle's AMP runs), True (always: the test seam that
drives the float16 branch on a CPU), False (never).

State saved: ``{"scaler": {scale, incr_count, decr_count, ...} or None,
"skipped_steps": int}``.

Host syncs: bfloat16, or any dtype without loss scaling, adds none. With loss
scaling one per optimizer step: deciding whether to skip the update (paddle's
optimizer reads the overflow flag on the host; see ``callbacks.loss_scaler``).
The scale and the skip counter stay on the device until ``on_log``.

On a CPU paddle runs neither auto_cast nor loss scaling: the callback says so
once in the log and training goes on in float32 (with ``loss_scaling=True`` the
scaler still runs, on float32 values).

    >>> from callbacks import AMP
    >>> amp = AMP(dtype="bf16", level="O1")
    >>> (amp.dtype, amp.level, amp.order)
    ('bfloat16', 'O1', 0)
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import paddle

from trainer.errors import ConfigError

from .base import Callback
from .loss_scaler import DynamicLossScaler

logger = logging.getLogger("callbacks.amp")

_DTYPES = {"float16": "float16", "fp16": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}
_LEVELS = ("O1", "O2")


class AMP(Callback):
    order = 0

    def __init__(self, dtype: str = "float16", level: str = "O1", init_loss_scaling: float = 2.0 ** 15,
                 incr_ratio: float = 2.0, decr_ratio: float = 0.5, incr_every_n_steps: int = 2000,
                 decr_every_n_nan_or_inf: int = 1, use_dynamic_loss_scaling: bool = True,
                 custom_white_list: Optional[Sequence[str]] = None, custom_black_list: Optional[Sequence[str]] = None,
                 loss_scaling: Optional[bool] = None):
        if dtype not in _DTYPES:
            raise ConfigError(f"AMP dtype={dtype!r} is not allowed: choose float16 or bfloat16")
        if level not in _LEVELS:
            raise ConfigError(f"AMP level={level!r} is not allowed: choose O1 or O2")
        if not init_loss_scaling > 0:
            raise ConfigError(f"AMP init_loss_scaling={init_loss_scaling!r} is not allowed: it must be a number > 0")
        if not incr_ratio > 1 or not 0 < decr_ratio < 1:
            raise ConfigError(f"AMP incr_ratio={incr_ratio!r}, decr_ratio={decr_ratio!r} are not allowed: "
                              "incr_ratio must be > 1 and decr_ratio in (0, 1)")
        if int(incr_every_n_steps) < 1 or int(decr_every_n_nan_or_inf) < 1:
            raise ConfigError(f"AMP incr_every_n_steps={incr_every_n_steps!r}, decr_every_n_nan_or_inf="
                              f"{decr_every_n_nan_or_inf!r} are not allowed: both must be integers >= 1")
        self.dtype = _DTYPES[dtype]
        self.level = level
        self.scaler_options = dict(init_loss_scaling=float(init_loss_scaling), incr_ratio=float(incr_ratio),
                                   decr_ratio=float(decr_ratio), incr_every_n_steps=int(incr_every_n_steps),
                                   decr_every_n_nan_or_inf=int(decr_every_n_nan_or_inf),
                                   use_dynamic_loss_scaling=bool(use_dynamic_loss_scaling))
        self.custom_white_list = list(custom_white_list) if custom_white_list else None
        self.custom_black_list = list(custom_black_list) if custom_black_list else None
        self.loss_scaling = loss_scaling
        self.scaler: Optional[DynamicLossScaler] = None
        self.skipped_steps = 0            # host total, updated at logging intervals and saves
        self._pending_scaler_state: Optional[dict] = None
        self._active: Optional[bool] = None
        self._warned = False
        self._decorated_model_id: Optional[int] = None

    # ---- the device seam ------------------------------------------------------
    def amp_runs_on_device(self) -> bool:
        """Whether paddle's auto_cast takes effect here (GPU, XPU, custom devices; not CPU)."""
        return not paddle.get_device().startswith("cpu")

    def scaler_enabled(self, trainer) -> bool:
        """Whether to scale the loss: ``loss_scaling`` when given, else float16 where AMP runs."""
        if self.loss_scaling is not None:
            return bool(self.loss_scaling)
        return self.dtype == "float16" and self.amp_runs_on_device()

    # ---- events -----------------------------------------------------------------
    def forward_context(self, trainer):
        if self._active is None:
            self._active = self.amp_runs_on_device()
        if not self._active:
            return None  # paddle would only warn that auto_cast does nothing here
        return paddle.amp.auto_cast(enable=True, custom_white_list=self.custom_white_list,
                                    custom_black_list=self.custom_black_list, level=self.level, dtype=self.dtype)

    def on_fit_begin(self, trainer):
        self._active = self.amp_runs_on_device()
        if not self._active:
            self._warn_once(trainer, f"AMP(dtype={self.dtype}, level={self.level}) is a no-op on {paddle.get_device()}: "
                                     "paddle runs auto_cast and loss scaling only on GPU, XPU and custom devices; "
                                     "training goes on in float32"
                                     + (" (loss scaling forced on: the scaler runs on float32 values)"
                                        if self.scaler_enabled(trainer) else ""))
        elif not _dtype_supported(self.dtype):
            self._warn_once(trainer, f"AMP dtype={self.dtype} is not supported by this device according to paddle: "
                                     "expect no speed-up (bfloat16 needs compute capability 8.0+)")
        if self.level == "O2":
            self._decorate(trainer)
        if self.scaler_enabled(trainer):
            if trainer.grad_scaler is not None and trainer.grad_scaler is not self.scaler:
                raise ConfigError(f"trainer.grad_scaler is already set to a {type(trainer.grad_scaler).__name__}: "
                                  "AMP installs its own loss scaler; remove the other one (or pass AMP(loss_scaling=False))")
            if self.scaler is None:
                params = [p for p in trainer.model.parameters() if not p.stop_gradient]
                self.scaler = DynamicLossScaler(parameters=params, **self.scaler_options)
            if self._pending_scaler_state:
                self.scaler.load_state_dict(self._pending_scaler_state)
            self._pending_scaler_state = None
            trainer.grad_scaler = self.scaler

    def on_backward_begin(self, trainer):
        if self._scaling(trainer):
            trainer.state.loss = self.scaler.scale(trainer.state.loss)

    def on_optimizer_step_begin(self, trainer):
        if self._scaling(trainer) and self.scaler.stage == "ready":
            self.scaler.unscale_(trainer.optimizer)

    def on_optimizer_step_end(self, trainer):
        if self._scaling(trainer) and self.scaler.stage != "ready":
            self.scaler.discard_step()  # the trainer skipped this update on a host flag

    def on_log(self, trainer):
        if not self._scaling(trainer) or "loss" not in trainer.state.logs:
            return
        self._fold_skipped(trainer)
        trainer.state.logs["loss_scale"] = self.scaler.get_loss_scaling()
        trainer.state.logs["amp_skipped_steps"] = self.skipped_steps

    def on_save_begin(self, trainer):
        if self._scaling(trainer):
            self._fold_skipped(trainer)

    def on_fit_end(self, trainer):
        if self._scaling(trainer):
            self._fold_skipped(trainer)
            trainer.grad_scaler = None  # a later fit() installs it again in on_fit_begin

    # ---- state --------------------------------------------------------------------
    def state_dict(self) -> dict:
        scaler = self.scaler.state_dict() if self.scaler is not None else self._pending_scaler_state
        return {"scaler": scaler, "skipped_steps": int(self.skipped_steps)}

    def load_state_dict(self, state: dict) -> None:
        # load_checkpoint runs before on_fit_begin builds the scaler: keep the state until then
        self.skipped_steps = int(state.get("skipped_steps", 0))
        scaler_state = state.get("scaler")
        if scaler_state and self.scaler is not None:
            self.scaler.load_state_dict(scaler_state)
        else:
            self._pending_scaler_state = scaler_state or None

    # ---- helpers --------------------------------------------------------------------
    def _scaling(self, trainer) -> bool:
        return self.scaler is not None and trainer.grad_scaler is self.scaler

    def _fold_skipped(self, trainer) -> None:
        """Read the device skip counter (a sync: logging intervals and saves only)."""
        n = self.scaler.take_skipped()
        self.skipped_steps += n
        trainer.state.skipped_steps += n

    def _decorate(self, trainer) -> None:
        if self._decorated_model_id == id(trainer.model):
            return
        if self._active and isinstance(trainer.model_wrapped, paddle.DataParallel):
            # DataParallel buckets gradients by the dtype the parameters had when it was built
            raise ConfigError("AMP level O2 needs the model decorated before DataParallel wraps it, but the trainer "
                              "wrapped it before on_fit_begin: use amp_level O1 under several processes")
        model, optimizer = paddle.amp.decorate(models=trainer.model, optimizers=trainer.optimizer, level="O2",
                                               dtype=self.dtype, master_weight=True)
        wrapped_is_model = trainer.model_wrapped is trainer.model
        trainer.model, trainer.optimizer = model, optimizer
        if wrapped_is_model:
            trainer.model_wrapped = model
        self._decorated_model_id = id(model)

    def _warn_once(self, trainer, message: str) -> None:
        if not self._warned and trainer.is_main_process:
            logger.warning(message)
        self._warned = True

    def __repr__(self) -> str:
        return f"AMP(dtype={self.dtype!r}, level={self.level!r}, loss_scaling={self.loss_scaling!r}, order={self.order})"


def _dtype_supported(dtype: str) -> bool:
    check = paddle.amp.is_float16_supported if dtype == "float16" else paddle.amp.is_bfloat16_supported
    try:
        return bool(check())
    except Exception:  # noqa: BLE001 - an unknown device: assume yes, paddle decides at run time
        return True
