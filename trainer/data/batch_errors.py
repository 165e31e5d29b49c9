"""Bad samples named: which sample index, which field, what is wrong (DataError, exit 3).

Without DataLoader workers the batch is built in the training process
(``trainer.data.InProcessLoader``), so a failing ``__getitem__``, samples whose
shapes differ, or a ``__len__`` larger than the data surface here with the
sample index instead of a bare paddle or numpy error. Labels outside the
model's classes are found when the loss raises (``label_error``): only then are
the labels copied to the host, so a healthy step pays nothing.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np
import paddle

from ..errors import DataError, TrainerError


def load_batch(dataset, indices: Sequence[int], collate_fn) -> Any:
    """``collate_fn([dataset[i] for i in indices])``; a failure is a DataError naming the sample and field.

    A dataset with ``__getitems__(indices)`` (PyTorch's name) returns the batch's samples in one call:
    a decoder that works a batch at a time (e.g. a DALI pipeline) gets the sampler's whole batch.
    """
    getitems = getattr(dataset, "__getitems__", None)
    samples = [] if getitems is None else _getitems(getitems, indices)
    for i in (indices if getitems is None else ()):
        try:
            samples.append(dataset[i])
        except TrainerError:
            raise
        except IndexError as exc:
            raise DataError(f"sample {i} cannot be read (IndexError: {exc}): the dataset's __len__ says "
                            f"{_len(dataset)} but __getitem__({i}) fails: make __len__ return the number of samples") from exc
        except Exception as exc:
            raise DataError(f"sample {i} cannot be loaded ({type(exc).__name__}: {exc}): "
                            "fix or remove that sample") from exc
    try:
        return collate_fn(samples)
    except TrainerError:
        raise
    except Exception as exc:
        where = _mismatch(samples, list(indices))
        raise DataError(f"the batch of samples {list(indices)[:16]} cannot be collated ({type(exc).__name__}: "
                        f"{exc}){': ' + where if where else ''}: give every sample of a field the same shape "
                        "or pass a collate_fn that pads") from exc


def _getitems(getitems, indices: Sequence[int]) -> list:
    try:
        samples = getitems(list(indices))
        samples = samples if isinstance(samples, list) else list(samples)  # an AssembledBatch stays one
    except TrainerError:
        raise
    except Exception as exc:
        raise DataError(f"the batch of samples {list(indices)[:16]} cannot be loaded ({type(exc).__name__}: {exc}): "
                        "fix or remove those samples") from exc
    if len(samples) != len(indices):
        raise DataError(f"__getitems__ returned {len(samples)} samples for the {len(indices)} indices "
                        f"{list(indices)[:16]}: return one sample per index")
    return samples


def _len(dataset) -> str:
    try:
        return str(len(dataset))
    except Exception:  # noqa: BLE001 - only for the message
        return "?"


def _fields(sample) -> List[tuple]:
    """(field name, value) pairs of one sample: tuple positions or dict keys."""
    if isinstance(sample, dict):
        return list(sample.items())
    if isinstance(sample, (list, tuple)):
        return [(f"field {k}", v) for k, v in enumerate(sample)]
    return [("the sample", sample)]


def _shape(value) -> Optional[tuple]:
    try:
        return tuple(np.shape(value))
    except Exception:  # noqa: BLE001 - ragged values have no shape
        return None


def _mismatch(samples: list, indices: List[int]) -> str:
    """Which field of which sample differs from the batch's first sample (shape or structure)."""
    if not samples:
        return ""
    first = _fields(samples[0])
    for sample, index in zip(samples[1:], indices[1:]):
        fields = _fields(sample)
        if [name for name, _ in fields] != [name for name, _ in first]:
            return (f"sample {index} has fields {[n for n, _ in fields]}, sample {indices[0]} has "
                    f"{[n for n, _ in first]}")
        for (name, value), (_, ref) in zip(fields, first):
            if _shape(value) != _shape(ref):
                return (f"{name} of sample {index} has shape {list(_shape(value) or [])}, of sample {indices[0]} "
                        f"{list(_shape(ref) or [])}")
    return ""


def label_error(outputs, labels, indices: Optional[Sequence[int]]) -> Optional[DataError]:
    """A DataError naming the samples whose class labels are outside ``[0, classes)`` of the outputs,
    or None when the labels are not the problem."""
    try:
        logits = outputs[0] if isinstance(outputs, (list, tuple)) else outputs
        classes = int(logits.shape[-1])
        values = np.asarray(labels.numpy() if hasattr(labels, "numpy") else labels)
    except Exception:  # noqa: BLE001 - not a classification output: say nothing
        return None
    if values.dtype.kind not in "iu" or values.size == 0:
        return None
    rows = values.reshape(values.shape[0], -1) if values.ndim else values.reshape(1, 1)
    bad = [(pos, int(v)) for pos, row in enumerate(rows) for v in row if (v < 0 or v >= classes) and v != -100]
    if not bad:
        return None
    pos, value = bad[0]
    index = indices[pos] if indices is not None and pos < len(indices) else None
    which = f"sample {index}" if index is not None else f"row {pos} of the batch"
    more = f" ({len(bad)} labels in this batch are out of range)" if len(bad) > 1 else ""
    return DataError(f"label {value} of {which} (field labels) is outside the model's {classes} classes "
                     f"[0, {classes - 1}]{more}: fix the labels or the model's number of classes")


_CLASS_LOSSES = ("CrossEntropyLoss", "NLLLoss")
_INDEX_DTYPES = (paddle.int64, paddle.int32)


def label_dtype_error(loss_fn, labels) -> Optional[DataError]:
    """A DataError when class-index labels have a float dtype for a classification loss (paddle would fail only in
    backward, with ``CrossEntropyWithSoftmaxGradCPUKernel is not implemented for data type float32``); else None.
    Reads the dtype only (no host copy)."""
    name = type(loss_fn).__name__
    if name not in _CLASS_LOSSES or getattr(loss_fn, "soft_label", False):
        return None
    dtype = getattr(labels, "dtype", "")
    if dtype in _INDEX_DTYPES:  # every step: the usual case without formatting the dtype
        return None
    dtype = str(dtype).replace("paddle.", "")
    if not dtype.startswith(("float", "bfloat")):
        return None
    return DataError(f"labels are {dtype} but {name} takes class indices of dtype int64: give int64 labels (e.g. "
                     "np.int64(label) in the dataset, or labels.astype('int64') in the collate_fn), or "
                     f"{name}(soft_label=True) for probabilities")


def backward_dtype_error(exc: BaseException, labels) -> Optional[DataError]:
    """For a loss computed inside the model: paddle's 'is not implemented for data type' from a backward kernel,
    as one line naming the labels' dtype; None for any other error."""
    text = str(exc)
    if "is not implemented for data type" not in text or "Grad" not in text:
        return None
    kernel = text.split('"')[1] if text.count('"') >= 2 else "a gradient kernel"
    dtype = str(getattr(labels, "dtype", "unknown")).replace("paddle.", "")
    return DataError(f"backward failed: {kernel} has no {text.split('data type')[1].split()[0].strip('`')} version; "
                     f"the labels are {dtype}: a classification loss needs int64 class indices "
                     "(e.g. np.int64(label) in the dataset, or labels.astype('int64') in the collate_fn)")
