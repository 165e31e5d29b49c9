"""Distributed helpers over ``paddle.distributed``: rank, world size, wrapping,
barriers, reductions and the all-gather of uneven tensors.

Everything works unchanged in a single process (world size 1: no collective
runs) and under ``python -m paddle.distributed.launch`` (gloo on CPU, NCCL on
GPUs). Rank and world size come from the launcher's environment
(``PADDLE_TRAINER_ID``, ``PADDLE_TRAINERS_NUM``), so they can be read before
``init_parallel_env``.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence

import numpy as np
import paddle
import paddle.distributed as dist


def get_rank() -> int:
    return int(os.environ.get("PADDLE_TRAINER_ID", "0"))


def get_world_size() -> int:
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def get_local_rank() -> int:
    """Rank within this node (``PADDLE_LOCAL_RANK``, else the global rank)."""
    return int(os.environ.get("PADDLE_LOCAL_RANK", os.environ.get("PADDLE_RANK_IN_NODE", get_rank())))


def is_main_process() -> bool:
    return get_rank() == 0


def is_distributed() -> bool:
    return get_world_size() > 1


_initialized = False


def init_distributed() -> None:
    """``init_parallel_env`` once, when launched with more than one process."""
    global _initialized
    if is_distributed() and not _initialized:
        if not dist.is_initialized():
            from .console import stderr_to_debug

            with stderr_to_debug("trainer.distributed"):  # paddle's "Modified FLAGS detected" banner
                dist.init_parallel_env()
        _initialized = True


def select_device(device: str = "auto") -> str:
    """Set paddle's device: ``gpu:<local rank>`` when asked or available, else cpu."""
    has_gpu = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if device == "gpu" and not has_gpu:
        from .errors import ConfigError

        raise ConfigError("device='gpu' but paddle sees no CUDA GPU: install paddlepaddle-gpu or use --device cpu")
    if device == "gpu" or (device == "auto" and has_gpu):
        name = f"gpu:{get_local_rank()}"
    else:
        name = "cpu"
    paddle.set_device(name)
    return name


def wrap_model(model: paddle.nn.Layer, find_unused_parameters: bool = False) -> paddle.nn.Layer:
    """``paddle.DataParallel`` when world size > 1, else the model itself."""
    if is_distributed():
        init_distributed()
        return paddle.DataParallel(model, find_unused_parameters=find_unused_parameters)
    return model


def unwrap_model(model: paddle.nn.Layer) -> paddle.nn.Layer:
    return model._layers if isinstance(model, paddle.DataParallel) else model


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
    """Reduce a few host floats across ranks in one collective (one sync)."""
    if not is_distributed():
        return [float(v) for v in values]
    t = paddle.to_tensor(np.asarray(values, dtype="float64"))
    t = all_reduce_mean(t) if op == "mean" else all_reduce_sum(t)
    return [float(v) for v in t.numpy()]


_MAX_DIMS = 8
_DTYPES = ["float32", "float64", "float16", "bfloat16", "int64", "int32", "bool", "uint8", "int8", "int16"]


def all_gather_uneven(tensor: Optional[paddle.Tensor]) -> Optional[paddle.Tensor]:
    """Concatenate along dim 0 the tensors of all ranks, whose first dims may differ.

    Rank r's rows come after rank r-1's. A rank with nothing to give passes
    ``None`` (or a tensor with 0 rows); the result is ``None`` only when every
    rank passed nothing. Shapes and dtypes are exchanged first, then each rank
    pads to the largest and the padding is cut off after the gather.
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
    trailing = [int(d) for d in ref[4:3 + ndim]]
    max_rows = int(metas_np[:, 0].max())
    if tensor is None or tensor.shape[0] == 0:
        local = paddle.zeros([max_rows] + trailing, dtype=dtype)
    else:
        pad = max_rows - tensor.shape[0]
        local = tensor if pad == 0 else paddle.concat([tensor, paddle.zeros([pad] + trailing, dtype=tensor.dtype)], axis=0)
    gathered: List[paddle.Tensor] = []
    dist.all_gather(gathered, local)
    parts = [g[: int(m[0])] for g, m in zip(gathered, metas_np) if m[0] > 0]
    return paddle.concat(parts, axis=0)


def gather_nested(value: Any) -> Any:
    """``all_gather_uneven`` over a tensor, or a tuple/list/dict of tensors."""
    if isinstance(value, (list, tuple)):
        return type(value)(gather_nested(v) for v in value)
    if isinstance(value, dict):
        return {k: gather_nested(v) for k, v in value.items()}
    return all_gather_uneven(value)
