"""Distributed helpers over ``paddle.distributed``: rank, world size, wrapping,
barriers, reductions and the all-gather of uneven tensors.

Everything works unchanged in a single process (world size 1: no collective
runs) and under ``python -m paddle.distributed.launch`` (gloo on CPU, NCCL on
GPUs). Rank and world size come from the launcher's environment
(``PADDLE_TRAINER_ID``, ``PADDLE_TRAINERS_NUM``), so they can be read before
``init_parallel_env``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import sys
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import paddle
import paddle.distributed as dist

from .device import plan_device
from .ranks import get_local_rank, get_rank, get_world_size, is_distributed, is_main_process  # noqa: F401 - re-exported
from .tensors import pad_to

# INFO on every rank, also where the CLI keeps other ranks' logs at WARNING: which card each rank uses
device_logger = logging.getLogger("trainer.device")
device_logger.setLevel(logging.INFO)


_initialized = False


def init_distributed() -> None:
    """``init_parallel_env`` once, when launched with more than one process."""
    global _initialized
    if is_distributed() and not _initialized:
        if not dist.is_initialized():
            with stderr_to_debug("trainer.distributed"):  # paddle's "Modified FLAGS detected" banner
                dist.init_parallel_env()
        _initialized = True


_device: Optional[Tuple[str, str]] = None   # (requested, place) once decided in this process


def select_device(device: str = "auto") -> str:
    """Set paddle's device from the launcher's assignment (``trainer.device.plan_device``); return it.

    Decided once per process and logged on every rank (logger ``trainer.device``):
    call it before any tensor is made (``ptrain`` does, before building the model;
    ``Trainer`` calls it again, which then only returns the decision).
    """
    global _device
    if _device is not None and _device[0] == device:
        return _device[1]
    plan = plan_device(os.environ, paddle.device.is_compiled_with_cuda(), _cuda_device_count(), device)
    for key, value in plan.env.items():  # read by init_parallel_env, which runs later (at the wrap)
        os.environ[key] = value
    paddle.set_device(plan.place)
    _device = (device, plan.place)
    # one line per rank where the choice matters (several processes, or a GPU); a lone CPU process: --verbose
    level = logging.INFO if get_world_size() > 1 or plan.place != "cpu" else logging.DEBUG
    device_logger.log(level, "rank %d (local rank %d) trains on %s: %s (CUDA_VISIBLE_DEVICES=%s)", get_rank(),
                       get_local_rank(), plan.place, plan.reason, os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
    return plan.place


def _cuda_device_count() -> int:
    return paddle.device.cuda.device_count() if paddle.device.is_compiled_with_cuda() else 0


def wrap_model(model: paddle.nn.Layer, find_unused_parameters: bool = False) -> paddle.nn.Layer:
    """``paddle.DataParallel`` when world size > 1, else the model itself."""
    if is_distributed():
        init_distributed()
        return paddle.DataParallel(model, find_unused_parameters=find_unused_parameters)
    return model


def unwrap_model(model: paddle.nn.Layer) -> paddle.nn.Layer:
    return model._layers if isinstance(model, paddle.DataParallel) else model


def broadcast_buffers(model: paddle.nn.Layer, src: int = 0) -> None:
    """Give every rank rank ``src``'s non-trained state: buffers and frozen parameters (BatchNorm
    running mean and variance, which paddle keeps as parameters with ``stop_gradient``).

    ``paddle.DataParallel`` averages gradients but never syncs buffers, so each
    rank's BatchNorm statistics follow its own shard; the trainer calls this
    before evaluation and before saving, so every rank evaluates with the
    statistics the checkpoint keeps. Buffers are packed per dtype: one
    broadcast per dtype, whatever the number of layers. A collective: every
    rank calls it; nothing happens in a single process.
    """
    if not is_distributed():
        return
    init_distributed()
    # paddle's BatchNorm keeps its statistics as non-trainable parameters (stop_gradient), not buffers
    state = [p for p in model.parameters() if p.stop_gradient] + [b for b in model.buffers() if b is not None and b.persistable]
    by_dtype: dict = {}
    for tensor in state:
        if math.prod(tensor.shape) > 0:
            by_dtype.setdefault(tensor.dtype, []).append(tensor)
    with paddle.no_grad():
        for buffers in by_dtype.values():
            flat = paddle.concat([b.reshape([-1]) for b in buffers])
            dist.broadcast(flat, src=src)
            offset = 0
            for b in buffers:
                n = math.prod(b.shape)
                paddle.assign(flat[offset:offset + n].reshape(b.shape), output=b)
                offset += n


def barrier() -> None:
    if is_distributed():
        init_distributed()
        dist.barrier()


def all_reduce_sum(tensor: paddle.Tensor) -> paddle.Tensor:
    """Sum over ranks (a new tensor; the input is unchanged)."""
    out = tensor.clone()
    if is_distributed():
        init_distributed()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def all_reduce_mean(tensor: paddle.Tensor) -> paddle.Tensor:
    """Mean over ranks (a new tensor)."""
    out = all_reduce_sum(tensor)
    return out / get_world_size() if is_distributed() else out


def reduce_scalars(values: Sequence[float], op: str = "mean") -> List[float]:
    """Reduce a few host floats across ranks in one collective (one sync); ``op``: mean, sum or max."""
    if not is_distributed():
        return [float(v) for v in values]
    t = paddle.to_tensor(np.asarray(values, dtype="float64"))
    if op == "max":
        init_distributed()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    else:
        t = all_reduce_mean(t) if op == "mean" else all_reduce_sum(t)
    return [float(v) for v in t.numpy()]


_MAX_DIMS = 8
_DTYPES = ["float32", "float64", "float16", "bfloat16", "int64", "int32", "bool", "uint8", "int8", "int16"]


def all_gather_uneven(tensor: Optional[paddle.Tensor], padding_index: Optional[float] = None) -> Optional[paddle.Tensor]:
    """Concatenate along dim 0 the tensors of all ranks, whose first dims may differ.

    Rank r's rows come after rank r-1's. A rank with nothing to give passes
    ``None`` (or a tensor with 0 rows); the result is ``None`` only when every
    rank passed nothing. Shapes and dtypes are exchanged first, then each rank
    pads to the largest and the padding is cut off after the gather.

    With ``padding_index`` the other dimensions may differ too (sequence lengths
    of token classification): every rank's rows are padded to the longest with
    ``padding_index``, which stays in the result, as PaddleNLP's
    ``_pad_across_processes`` does. Without it they must agree.
    """
    if not is_distributed():
        return tensor
    init_distributed()
    meta = np.full(3 + _MAX_DIMS, -1, dtype="int64")
    if tensor is not None and tensor.shape[0] > 0:
        if tensor.ndim > _MAX_DIMS:
            raise ValueError(f"all_gather_uneven takes at most {_MAX_DIMS} dims, got {tensor.ndim}")
        dtype = str(tensor.dtype).replace("paddle.", "")
        meta[0], meta[1], meta[2] = tensor.shape[0], tensor.ndim, _DTYPES.index(dtype)
        meta[3:3 + tensor.ndim] = tensor.shape
    else:
        meta[0] = 0
    metas: List[paddle.Tensor] = []
    dist.all_gather(metas, paddle.to_tensor(meta))
    metas_np = np.stack([m.numpy() for m in metas])
    givers = [m for m in metas_np if m[0] > 0]
    if not givers:
        return None
    ref = givers[0]
    ndim, dtype = int(ref[1]), _DTYPES[int(ref[2])]
    if any(int(m[1]) != ndim for m in givers):
        raise ValueError(f"ranks give outputs of different ranks {sorted({int(m[1]) for m in givers})}: "
                         "every rank must give tensors with the same number of dimensions")
    shapes = [[int(d) for d in m[4:3 + ndim]] for m in givers]
    if padding_index is None and any(s != shapes[0] for s in shapes):
        raise ValueError(f"ranks give outputs of shapes {shapes} beyond the first dimension: pass a padding_index")
    trailing = [max(s[d] for s in shapes) for d in range(ndim - 1)]
    max_rows = int(metas_np[:, 0].max())
    fill = 0 if padding_index is None else padding_index
    if tensor is None or tensor.shape[0] == 0:
        local = paddle.full([max_rows] + trailing, fill, dtype=dtype)
    else:
        local = pad_to(tensor, [max_rows] + trailing, fill)
    gathered: List[paddle.Tensor] = []
    dist.all_gather(gathered, local)
    parts = [g[: int(m[0])] for g, m in zip(gathered, metas_np) if m[0] > 0]
    return paddle.concat(parts, axis=0)


def gather_nested(value: Any, padding_index: Optional[float] = None) -> Any:
    """``all_gather_uneven`` over a tensor, or a tuple/list/dict of tensors."""
    if isinstance(value, (list, tuple)):
        return type(value)(gather_nested(v, padding_index) for v in value)
    if isinstance(value, dict):
        return {k: gather_nested(v, padding_index) for k, v in value.items()}
    return all_gather_uneven(value, padding_index)


@contextlib.contextmanager
def stderr_to_debug(logger_name: str) -> Iterator[None]:
    """Capture what Python code writes to ``sys.stderr`` inside the block and log it at DEBUG
    on ``logger_name`` (shown with ``--verbose``); paddle prints banners this way."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stderr(buffer):
            yield
    except BaseException:
        sys.stderr.write(buffer.getvalue())  # it may explain the failure: show it as it was
        raise
    text = buffer.getvalue().strip()
    if text:
        logging.getLogger(logger_name).debug("%s", text)
