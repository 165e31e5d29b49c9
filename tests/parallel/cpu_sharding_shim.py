"""TEST-ONLY shim: paddle's ``group_sharded_parallel`` (sharding stages 2 and 3) on a CPU build of paddle.

Never imported by the product (``trainer/`` takes paddle's path unchanged); the parity workers install it in
their own process (``install()``), and ``tests/parallel/conftest.py`` offers it as a fixture. It bypasses
exactly these, and nothing else:

1. ``paddle/distributed/sharding/group_sharded.py``: ``assert device in ["gpu", "xpu"] or device in
   paddle.device.get_all_custom_device_type()`` ("only support gpu, xpu and custom_device"): the list
   holds "cpu" when, and only when, that module asks.
2. ``GroupShardedOptimizerStage2.__init__`` and ``GroupShardedStage3.__init__``: ``assert
   core.is_compiled_with_cuda() or ...``: True when, and only when, those two constructors ask.
3. ``group_sharded_storage``: ``cvt_to_device`` builds a hard-coded ``CUDAPlace`` (raises on a CPU
   build): the buffer stays on the CPU place it is on.
4. ``ParamStorage._add_param_as_view``: ``param.cpu()`` then ``param._clear_data()``; on CPU ``cpu()``
   shares the parameter's memory, so the clear wipes the copy too: ``cpu()`` gives a real copy inside it.
5. ``paddle.get_device()`` read as ``"<type>:<id>"`` (``int(get_device().split(":")[1])`` in
   ``GroupShardedOptimizerStage2.__init__``; ``GroupShardedStage3.__init__`` hands it to its clip, whose
   ``_dygraph_clip`` splits it too and moves the norm to CUDA when the device is "cpu"): "cpu:0" when,
   and only when, those three ask (stage 3's own reading of "cpu:0" is what it reads of "cpu").
6. the product's own refusal of stages 2 and 3 on a CPU build (``trainer.capabilities``, before anything is
   launched): lifted in this process through its test-only ``grant_for_tests``.

What only this shim exercises (the GPU runs them unshimmed: benchmarks/gpu_check.py): the guards above,
the CUDA copies they stand for, and every stage 2/3 collective over NCCL instead of gloo.
"""

from __future__ import annotations

import functools
import sys

import paddle
from paddle.base import core

_installed = False


def _caller(depth: int = 2):
    """(module, function) of the code that called the patched function (depth 2: the patched function's caller)."""
    frame = sys._getframe(depth)
    return frame.f_globals.get("__name__"), frame.f_code.co_name


def install() -> None:
    global _installed
    if _installed:
        return
    from paddle.distributed.fleet.meta_parallel.sharding import (
        group_sharded_storage as storage,
    )

    custom_types = paddle.device.get_all_custom_device_type

    def get_all_custom_device_type():  # 1.
        found = list(custom_types() or [])
        return found + ["cpu"] if _caller()[0] == "paddle.distributed.sharding.group_sharded" else found

    paddle.device.get_all_custom_device_type = get_all_custom_device_type

    compiled_with_cuda = core.is_compiled_with_cuda
    constructors = ("paddle.distributed.fleet.meta_parallel.sharding.group_sharded_optimizer_stage2",
                    "paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage3")

    def is_compiled_with_cuda():  # 2.
        module, function = _caller()
        if module in constructors and function == "__init__":
            return True
        return compiled_with_cuda()

    core.is_compiled_with_cuda = is_compiled_with_cuda

    get_device = paddle.device.get_device
    device_readers = {("paddle.distributed.fleet.meta_parallel.sharding.group_sharded_optimizer_stage2", "__init__"),
                      ("paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage3", "__init__"),
                      ("paddle.distributed.fleet.meta_parallel.sharding.group_sharded_utils", "_dygraph_clip")}

    def get_device_with_id():  # 5.
        device = get_device()
        return "cpu:0" if device == "cpu" and _caller() in device_readers else device

    paddle.device.get_device = paddle.get_device = get_device_with_id

    storage.cvt_to_device = lambda x, dev_id, blocking=True: x._copy_to(paddle.CPUPlace(), blocking)  # 3.

    add_view = storage.ParamStorage._add_param_as_view

    @functools.wraps(add_view)
    def add_param_as_view(self, param, align, convert_gpu=True):  # 4.
        cpu = core.eager.Tensor.cpu
        core.eager.Tensor.cpu = lambda t: paddle.assign(t)
        try:
            return add_view(self, param, align, convert_gpu)
        finally:
            core.eager.Tensor.cpu = cpu

    storage.ParamStorage._add_param_as_view = add_param_as_view
    from trainer.capabilities import grant_for_tests

    grant_for_tests(("sharding stage2", "sharding stage3"), by=__name__)  # 6.
    _installed = True
