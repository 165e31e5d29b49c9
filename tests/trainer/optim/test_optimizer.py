"""``trainer.optim``: the optimizer ``create_optimizer`` builds, its weight-decay groups, its clip and its
learning rate, in real Trainer runs."""

import doctest

import numpy as np
import paddle
import pytest
from helpers import ToyDataset, make_mlp

import trainer.optim.optimizer
from trainer import ConfigError, Trainer, TrainingArguments
from trainer.optim.optimizer import build_optimizer, peak_lr


def test_docstring_examples():
    result = doctest.testmod(trainer.optim.optimizer)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize("optim", ["adamw", "momentum", "sgd"])
def test_weight_decay_reaches_matrices_only(tmp_path, optim):
    """One step of a zero loss: only weight decay moves a parameter (AdamW's decoupled decay, Momentum's and
    SGD's L2 term in their decayed group), so the matrices move and the biases (started at 1) stay."""
    args = TrainingArguments(output_dir=str(tmp_path), optim=optim, weight_decay=0.5, learning_rate=1.0,
                             lr_scheduler_type="constant", max_steps=1, per_device_train_batch_size=4, report_to=[],
                             save_strategy="no", device="cpu")
    model = make_mlp()
    for p in model.parameters():
        if p.ndim == 1:  # paddle starts biases at 0, which decay would leave at 0
            p.set_value(paddle.ones_like(p))
    before = {n: p.numpy().copy() for n, p in model.named_parameters()}
    Trainer(model, args, train_dataset=ToyDataset(8), loss_fn=_zero_loss).fit()
    for name, p in model.named_parameters():
        moved = not np.array_equal(p.numpy(), before[name])
        assert moved == (p.ndim >= 2), (optim, name)


def _zero_loss(outputs, labels):
    """Gradients of zero: only weight decay moves a parameter."""
    return (outputs * 0).sum()


def test_a_clip_inside_the_optimizer_refuses_two_groups():
    """paddle clips each parameter group by its own norm: Momentum/SGD with weight decay and a clip of their own
    would clip by two norms, so the build refuses, naming the layout and both ways out."""
    layer = paddle.nn.Linear(2, 2)
    args = TrainingArguments(output_dir="out", optim="sgd", weight_decay=0.1)
    with pytest.raises(ConfigError, match=r'optim=sgd with weight_decay .* under sharding stage 2: .*optim="adamw".*weight_decay=0.0'):
        build_optimizer(args, 0.1, list(layer.parameters()), {layer.weight.name},
                        paddle.nn.ClipGradByGlobalNorm(1.0), "sharding stage 2")
    clipped = build_optimizer(TrainingArguments(output_dir="out", optim="sgd"), 0.1, list(layer.parameters()),
                              {layer.weight.name}, paddle.nn.ClipGradByGlobalNorm(1.0), "sharding stage 2")
    assert isinstance(clipped, paddle.optimizer.SGD)


def test_the_linear_scaling_rule_sets_the_peak():
    args = TrainingArguments(output_dir="out", learning_rate=0.1, scale_lr_by_batch=64)
    assert peak_lr(args, 256) == pytest.approx(0.4)
    assert peak_lr(TrainingArguments(output_dir="out", learning_rate=0.1), 256) == 0.1
