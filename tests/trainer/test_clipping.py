"""Clipping with float16 gradients beside float32 ones (AMP O2 keeps norm weights in float32)."""

import numpy as np
import paddle

from host_syncs import CountSyncs
from trainer import Trainer, TrainingArguments


class MixedDtypes(paddle.nn.Layer):
    """A float32 Linear and a float16 (and a bfloat16) scale, as AMP O2 leaves a model."""

    def __init__(self):
        super().__init__()
        paddle.seed(0)
        self.fc = paddle.nn.Linear(4, 3)
        self.scale16 = self.create_parameter([3], dtype="float16", default_initializer=paddle.nn.initializer.Constant(1.5))
        self.scale_bf16 = self.create_parameter([3], dtype="bfloat16", default_initializer=paddle.nn.initializer.Constant(0.5))

    def forward(self, x):
        return self.fc(x) * self.scale16.astype("float32") * self.scale_bf16.astype("float32")


def _grads(model):
    return {n: p.grad.astype("float32").numpy().astype("float64") for n, p in model.named_parameters()}


def test_clip_gradients_with_float16_and_float32_gradients(tmp_path):
    model = MixedDtypes()
    trainer = Trainer(model, TrainingArguments(output_dir=str(tmp_path), report_to=[]))
    model(paddle.to_tensor(np.random.RandomState(0).randn(8, 4).astype("float32"))).sum().backward()
    before = _grads(model)
    true_norm = np.sqrt(sum((g ** 2).sum() for g in before.values()))
    assert true_norm > 1.0
    counter = CountSyncs()
    with counter.installed():
        counter._counting = True
        norm = trainer.clip_gradients(1.0)
        counter._counting = False
    assert counter._count == 0, counter.sources  # no host sync
    assert norm.dtype == paddle.float32
    np.testing.assert_allclose(float(norm), true_norm, rtol=1e-5)
    after = _grads(model)
    assert {p.grad.dtype for p in model.parameters()} == {paddle.float32, paddle.float16, paddle.bfloat16}
    np.testing.assert_allclose(np.sqrt(sum((g ** 2).sum() for g in after.values())), 1.0, rtol=1e-2)
    coef = 1.0 / true_norm
    for name in before:  # each gradient scaled by the same coefficient, within its own dtype's precision
        np.testing.assert_allclose(after[name], before[name] * coef, rtol=1e-2, atol=1e-4)


def test_clip_gradients_below_the_limit_leaves_gradients_alone(tmp_path):
    model = MixedDtypes()
    trainer = Trainer(model, TrainingArguments(output_dir=str(tmp_path), report_to=[]))
    model(paddle.ones([2, 4])).sum().backward()
    before = _grads(model)
    trainer.clip_gradients(1e6)
    for name, g in _grads(model).items():
        np.testing.assert_array_equal(g, before[name])


def test_docstring_examples_of_the_gpu_seams():
    import doctest

    import models.resnet.transforms
    import trainer.optim.clipping
    import trainer.device
    import trainer.deploy.export
    import trainer.tensors

    for module in (trainer.optim.clipping, trainer.device, trainer.tensors, trainer.deploy.export, models.resnet.transforms):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
