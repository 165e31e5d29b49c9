"""Which device this process trains on, decided once from the launcher's assignment.

``python -m paddle.distributed.launch --devices 4,5`` (what ``ptrain run --gpus``
passes) gives each worker its card in ``FLAGS_selected_gpus`` (``4`` and ``5``,
counted within ``CUDA_VISIBLE_DEVICES`` when that is set), not by renumbering
``CUDA_VISIBLE_DEVICES``. paddle's default place and ``init_parallel_env`` both
read that flag (``ParallelEnv().device_id``, its first id), so the trainer must
too: picking ``gpu:<local rank>`` would put every tensor made before
``init_parallel_env`` on the wrong card.

:func:`plan_device` is the whole decision as a pure function of the
environment, whether paddle is compiled with CUDA, how many cards it sees and
``args.device``; :func:`trainer.distributed.select_device` applies it once per
process, before any tensor is made, and logs it on every rank.

Example::

    >>> plan_device({"FLAGS_selected_gpus": "5", "PADDLE_TRAINERS_NUM": "2"}, True, 8, "auto").place
    'gpu:5'
    >>> plan = plan_device({"PADDLE_TRAINERS_NUM": "2"}, True, 8, "cpu")
    >>> plan.place, plan.env
    ('cpu', {'PADDLE_DISTRI_BACKEND': 'gloo'})
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping

from .errors import ConfigError, option

#: the one list of device choices (TrainingArguments.device validates against it)
DEVICES = ("auto", "cpu", "gpu")


@dataclass(frozen=True)
class DevicePlan:
    """``place`` for ``paddle.set_device``; ``env``: variables to set before ``init_parallel_env``."""

    place: str
    env: Dict[str, str] = field(default_factory=dict)
    reason: str = ""


def plan_device(env: Mapping[str, str], compiled_with_cuda: bool, gpu_count: int, requested: str) -> DevicePlan:
    """The device of this process (see the module docstring).

    - ``cpu``: CPU. With several processes on a CUDA build paddle's
      ``init_parallel_env`` would pick NCCL and move the process to a GPU; the
      plan sets ``PADDLE_DISTRI_BACKEND=gloo`` to keep it on the CPU.
    - ``gpu``, or ``auto`` when paddle sees a card: ``gpu:<first id of
      FLAGS_selected_gpus>``, the launcher's assignment (``ParallelEnv().device_id``);
      without the flag (a plain ``python train.py``), ``gpu:0`` as paddle's default place.
    - ``auto`` without a card: CPU.
    """
    if requested not in DEVICES:
        raise ConfigError(f"device={requested!r} is not one of {', '.join(DEVICES)}")
    world = int(env.get("PADDLE_TRAINERS_NUM", "1") or 1)
    has_gpu = compiled_with_cuda and gpu_count > 0
    if requested == "gpu" and not has_gpu:
        raise ConfigError("device='gpu' but paddle sees no CUDA GPU: install paddlepaddle-gpu, check "
                          f"CUDA_VISIBLE_DEVICES, or use {option('device', 'cpu')}")
    if requested == "cpu" or not has_gpu:
        extra = {}
        backend = env.get("PADDLE_DISTRI_BACKEND")
        if world > 1 and compiled_with_cuda:
            if backend not in (None, "", "gloo"):
                raise ConfigError(f"device='cpu' with PADDLE_DISTRI_BACKEND={backend}: that backend runs on GPUs; "
                                  f"unset it (gloo is used on CPU) or use {option('device', 'gpu')}")
            if not backend:
                extra["PADDLE_DISTRI_BACKEND"] = "gloo"
        why = "device cpu asked for" if requested == "cpu" else (
            "device auto: paddle is built without CUDA" if not compiled_with_cuda else "device auto: paddle sees no CUDA GPU")
        return DevicePlan("cpu", extra, why)
    selected = (env.get("FLAGS_selected_gpus") or "").strip()
    if selected:
        first = selected.split(",")[0].strip()
        if not first.isdigit():
            raise ConfigError(f"FLAGS_selected_gpus={selected!r} is not a list of GPU ids: launch with "
                              "python -m paddle.distributed.launch --devices 0,1,... (ptrain run --gpus)")
        device_id, why = int(first), f"FLAGS_selected_gpus={selected}"
    else:
        device_id, why = 0, "no FLAGS_selected_gpus: paddle's default card"
    if device_id >= gpu_count:
        visible = env.get("CUDA_VISIBLE_DEVICES")
        raise ConfigError(f"FLAGS_selected_gpus={selected} names GPU {device_id} but paddle sees {gpu_count} "
                          f"(CUDA_VISIBLE_DEVICES={visible}): pass ids that exist to --gpus; with "
                          "CUDA_VISIBLE_DEVICES set, the launcher's --devices are ids from that list")
    return DevicePlan(f"gpu:{device_id}", {}, why)
