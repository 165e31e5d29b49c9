"""Device tensors to host numpy arrays, the one conversion every reader uses; and
tensors padded to a common shape (:func:`pad_to`), which joining and gathering
outputs of different sequence lengths use.

``Tensor.numpy()`` of a ``bfloat16`` tensor returns its raw bits as ``uint16``
(``[-2, 1, 3]`` reads ``[49152, 16256, 16448]``): numpy has no bfloat16. Under
bf16 ``auto_cast`` a classifier's logits are bf16, so argmax, top-k, saved
predictions and export comparisons would read bit patterns. :func:`to_numpy`
casts low-precision floats (bfloat16, float16) to float32 on the device first;
float32 holds every bfloat16 and float16 value exactly, so nothing is lost.

Example::

    >>> import paddle
    >>> to_numpy(paddle.to_tensor([-2.0, 1.0, 3.0]).astype("bfloat16")).tolist()
    [-2.0, 1.0, 3.0]
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import paddle

PADDING_INDEX = -100  # PaddleNLP's and Hugging Face's nested_concat(..., padding_index=-100)


def to_float32_if_low_precision(t: paddle.Tensor, keep_float16: bool = False) -> paddle.Tensor:
    """``t`` cast to float32 when it is bfloat16 (or float16, unless ``keep_float16``), else ``t`` itself."""
    if t.dtype == paddle.bfloat16 or (t.dtype == paddle.float16 and not keep_float16):
        return t.astype("float32")
    return t


def to_numpy(value: Any, keep_float16: bool = False) -> Any:
    """A host copy of a tensor (low-precision floats as float32), or of each tensor in a
    list/tuple/dict; ``None`` and non-tensors pass through (numpy arrays as they are).

    ``keep_float16``: float16 stays float16 (numpy has it; checkpoints store it
    as it is); bfloat16 always becomes float32. A device-to-host copy: call it at
    logging, evaluation or save time, never per step.
    """
    if value is None:
        return None
    if isinstance(value, paddle.Tensor):
        return np.ascontiguousarray(to_float32_if_low_precision(value, keep_float16).numpy())
    if isinstance(value, dict):
        return {k: to_numpy(v, keep_float16) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_numpy(v, keep_float16) for v in value)
    return value


def pad_to(tensor: paddle.Tensor, shape: Sequence[int], padding_index: float = PADDING_INDEX) -> paddle.Tensor:
    """``tensor`` in the leading corner of a ``shape`` tensor filled with ``padding_index`` (``tensor`` itself when
    it has that shape already); on the tensor's device, no host copy."""
    if list(tensor.shape) == [int(n) for n in shape]:
        return tensor
    if tensor.ndim != len(shape) or any(int(a) > int(b) for a, b in zip(tensor.shape, shape)):
        raise ValueError(f"cannot pad outputs of shape {list(tensor.shape)} to {list(shape)}: every batch must give "
                         "predictions and labels with the same number of dimensions")
    fill = bool(padding_index) if tensor.dtype == paddle.bool else padding_index
    out = paddle.full([int(n) for n in shape], fill, dtype=tensor.dtype)
    out[tuple(slice(0, int(n)) for n in tensor.shape)] = tensor
    return out
