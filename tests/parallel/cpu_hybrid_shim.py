"""TEST-ONLY shim: fleet's tensor- and pipeline-parallel paths on a CPU build of paddle over gloo.

Never imported by the product (``trainer/`` takes paddle's paths unchanged); the tensor- and pipeline-parallel
workers install it in their own process (``install()``) before they build a model. It replaces exactly these,
each with the same arithmetic, and nothing else:

1. ``ProcessGroup.all_reduce_on_calc_stream(tensor, op)`` (gloo refuses it: "ProcessGroupGloo does not support
   all_reduce_on_calc_stream"): a blocking ``all_reduce`` of the same group, in place. Called by
   ``mp_ops.c_identity_eager.backward`` (the gradient of a ColumnParallelLinear's / RowParallelLinear's input)
   and ``mp_ops.mp_allreduce_eager.forward`` (RowParallelLinear's and VocabParallelEmbedding's output sum).
2. the ``c_identity`` op (``paddle._C_ops.c_identity``: no CPU kernel): a copy of its input. It is the forward of
   ``mp_ops.c_identity_eager`` (ColumnParallelLinear's input) and the backward of ``mp_allreduce_eager``; on a GPU
   it is an identity on the calculation stream too.
3. ``ParallelEnv._device_id``, never set on a CPU build (``ParallelEnv.device_id`` raises AttributeError): 0.
   Read by the pipeline schedule (``pp_utils``) and ``init_parallel_env``'s communication context.
4. ``ProcessGroup.send_on_calc_stream`` / ``recv_on_calc_stream`` (gloo refuses them): blocking ``send`` /
   ``recv`` of the same group (the pipeline's activations and gradients between stages).
5. ``_c_concat`` (``paddle.distributed.collective._c_concat`` = ``mp_ops._c_concat``: the ``c_concat`` op has no
   CPU kernel): an all-gather over the group and a concatenation on the last axis, whose gradient is this rank's
   slice, as the op's (``c_split``). Called by PaddleNLP's ``parallel_matmul`` when a tensor-parallel model
   gathers its logits (``tensor_parallel_output=False``) and by ColumnParallelLinear with ``gather_output=True``.
6. the product's own refusal of tensor and pipeline parallel on a CPU build (``trainer.capabilities``, before
   anything is launched): lifted in this process through its test-only ``grant_for_tests``.

What only this shim exercises (a GPU runs them unshimmed: benchmarks/gpu_check.py): NCCL's in-stream all-reduce
and point-to-point calls above, the c_identity kernel, and the device id a GPU rank reads from its launcher.
"""

from __future__ import annotations

import paddle
from paddle.autograd import PyLayer
from paddle.base import core

_installed = False


class _Concat(PyLayer):  # 5.
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.rank, ctx.nranks = group.rank, group.nranks
        parts: list = []
        paddle.distributed.all_gather(parts, tensor, group=group)
        return paddle.concat(parts, axis=-1)

    @staticmethod
    def backward(ctx, grad):
        return paddle.split(grad, ctx.nranks, axis=-1)[ctx.rank]


def _c_concat(tensor, group=None):  # 5.
    if group is None:
        from paddle.distributed import fleet

        group = fleet.get_hybrid_communicate_group().get_model_parallel_group()
    return _Concat.apply(tensor, group)


def install() -> None:
    global _installed
    if _installed:
        return
    group_class = core.ProcessGroup

    def all_reduce_on_calc_stream(self, tensor, op=core.ReduceOp.SUM):  # 1.
        self.all_reduce(tensor, op, True).wait()

    def send_on_calc_stream(self, tensor, dst):  # 4.
        self.send(tensor, dst, True).wait()

    def recv_on_calc_stream(self, tensor, src):  # 4.
        self.recv(tensor, src, True).wait()

    group_class.all_reduce_on_calc_stream = all_reduce_on_calc_stream
    group_class.send_on_calc_stream = send_on_calc_stream
    group_class.recv_on_calc_stream = recv_on_calc_stream

    def c_identity(tensor, *args):  # 2.
        return paddle.assign(tensor)

    paddle._C_ops.c_identity = c_identity

    from paddle.distributed.parallel import ParallelEnv

    init = ParallelEnv.__init__

    def parallel_env_init(self, *args, **kwargs):  # 3.
        init(self, *args, **kwargs)
        if not hasattr(self, "_device_id"):
            self._device_id = 0

    ParallelEnv.__init__ = parallel_env_init

    from paddle.distributed import collective
    from paddle.distributed.fleet.layers.mpu import mp_ops

    collective._c_concat = mp_ops._c_concat = _c_concat
    from trainer.capabilities import grant_for_tests

    grant_for_tests(("tensor parallel", "pipeline parallel"), by=__name__)  # 6.
    _installed = True
