"""Peak memory of this process, for ``skip_memory_metrics=False`` (PaddleNLP's field).

What is read, on every rank, at logging steps only (never in a step):

- ``peak_host_rss_mb``: the host resident-set high-water mark of this process (``getrusage``'s
  ``ru_maxrss``: the kernel keeps it, reading it costs one system call and no device work);
- on a GPU (the seam :func:`gpu_peaks`): ``peak_gpu_allocated_mb`` and ``peak_gpu_reserved_mb``,
  paddle's ``max_memory_allocated`` / ``max_memory_reserved`` of the current card (host-side counters of
  paddle's allocator, no device sync).

:func:`peak_memory_record` reduces them over ranks with MAX (one collective, at a logging step) so the
logged number is the rank that needs the most; :func:`peak_memory_per_rank` gives each rank's, for
``results.json``.

    >>> record = peak_memory_record()
    >>> record["peak_host_rss_mb"] > 0
    True
"""

from __future__ import annotations

import resource
import sys
from typing import Dict, List

import paddle

from . import distributed as dist


def gpu_peaks() -> Dict[str, float]:
    """paddle's allocator high-water marks of the current card, in MiB; empty without a GPU (the seam)."""
    if not paddle.is_compiled_with_cuda() or "gpu" not in str(paddle.get_device()):
        return {}
    cuda = paddle.device.cuda  # pragma: no cover - needs a GPU (benchmarks/gpu_check.py)
    return {"peak_gpu_allocated_mb": cuda.max_memory_allocated() / 2**20,  # pragma: no cover
            "peak_gpu_reserved_mb": cuda.max_memory_reserved() / 2**20}


def local_peaks() -> Dict[str, float]:
    """This process's peaks in MiB (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_mb = rss / 2**20 if sys.platform == "darwin" else rss / 1024
    return {"peak_host_rss_mb": round(rss_mb, 1), **{k: round(v, 1) for k, v in gpu_peaks().items()}}


def peak_memory_record() -> Dict[str, float]:
    """The peaks, each the largest over ranks (one collective on every rank: call it on all of them)."""
    peaks = local_peaks()
    values = dist.reduce_scalars(list(peaks.values()), op="max")
    return {k: round(v, 1) for k, v in zip(peaks, values)}


def peak_memory_per_rank() -> Dict[str, List[float]]:
    """Each rank's peaks in rank order, ``{name: [rank 0, rank 1, ...]}`` (a collective: every rank calls it)."""
    peaks = local_peaks()
    world = dist.get_world_size()
    out: Dict[str, List[float]] = {}
    for name, value in peaks.items():
        mine = [0.0] * world
        mine[dist.get_rank()] = value
        out[name] = [round(v, 1) for v in dist.reduce_scalars(mine, op="sum")]
    return out
