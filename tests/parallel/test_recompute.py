"""recompute=True acts: blocks run under paddle's non-reentrant recompute (Dropout included) and the gradients
are exactly the plain run's; a PaddleNLP model is switched through its own enable_recompute; a set-up that would
drop gradients silently is refused."""

import numpy as np
import paddle
import pytest
from helpers import params_of

from trainer import Trainer, TrainingArguments
from trainer.errors import ConfigError, TrainingError
from trainer.parallel.recompute import apply_recompute, recomputed_blocks


class Net(paddle.nn.Layer):
    def __init__(self, hidden=32, depth=3, dropout=0.3):
        super().__init__()
        self.inp = paddle.nn.Linear(8, hidden)
        self.blocks = paddle.nn.LayerList([
            paddle.nn.Sequential(paddle.nn.Linear(hidden, hidden), paddle.nn.GELU(), paddle.nn.Dropout(dropout))
            for _ in range(depth)])
        self.head = paddle.nn.Linear(hidden, 2)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


class Data(paddle.io.Dataset):
    def __init__(self, n=64):
        rng = np.random.RandomState(0)
        self.x, self.y = rng.randn(n, 8).astype("float32"), rng.randint(0, 2, n).astype("int64")

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _grads(recompute: bool, **kwargs):
    paddle.seed(3)
    net = Net()
    if recompute:
        assert apply_recompute(net, **kwargs) == 3
    x = paddle.to_tensor(np.random.RandomState(1).randn(16, 8).astype("float32"))
    paddle.seed(11)  # the same dropout masks in both runs
    net(x).square().mean().backward()
    return {i: p.grad.numpy() for i, p in enumerate(net.parameters())}


def test_gradients_under_recompute_equal_the_plain_run_exactly_with_dropout():
    plain, recomputed = _grads(False), _grads(True)
    assert plain.keys() == recomputed.keys() and len(plain) == 10
    worst = max(float(np.abs(plain[k] - recomputed[k]).max()) for k in plain)
    print(f"RECOMPUTE max gradient difference: {worst}")
    assert worst == 0.0


def test_recompute_true_in_training_gives_the_plain_runs_parameters_bit_for_bit(tmp_path):
    def train(recompute):
        paddle.seed(5)
        net = Net()
        args = TrainingArguments(output_dir=str(tmp_path / str(recompute)), per_device_train_batch_size=8,
                                 max_steps=6, learning_rate=0.01, report_to=[], save_strategy="no",
                                 evaluation_strategy="no", recompute=recompute, device="cpu")
        trainer = Trainer(net, args, train_dataset=Data(), loss_fn=paddle.nn.CrossEntropyLoss())
        trainer.fit()
        assert trainer.layout.recompute is recompute
        return params_of(net), trainer

    plain, _ = train(False)
    recomputed, trainer = train(True)
    assert [name for name, _ in recomputed_blocks(trainer.model)] == ["blocks.0", "blocks.1", "blocks.2"]
    for name in plain:
        np.testing.assert_array_equal(plain[name], recomputed[name], err_msg=name)
    assert set(plain) == set(trainer.model.state_dict())  # parameter names unchanged: checkpoints load either way


def test_named_modules_choose_the_blocks_and_an_unknown_name_is_refused():
    net = Net()
    assert [n for n, _ in recomputed_blocks(net, ["Sequential"])] == ["blocks.0", "blocks.1", "blocks.2"]
    assert [n for n, _ in recomputed_blocks(net, ["head", "blocks"])] == ["blocks.0", "blocks.1", "blocks.2", "head"]
    with pytest.raises(ConfigError, match="recompute_modules names 'decoder'"):
        apply_recompute(net, ["decoder"])
    with pytest.raises(ConfigError, match="no LayerList"):
        apply_recompute(paddle.nn.Linear(2, 2))


def test_reentrant_recompute_that_would_drop_gradients_is_refused():
    from paddle.distributed.fleet.utils import recompute

    # what the refusal prevents: paddle's reentrant recompute gives the block's parameters no gradient
    block = paddle.nn.Linear(4, 4)
    x = paddle.ones([2, 4])  # stop_gradient=True, as the model's first input is
    recompute(block, x, use_reentrant=True).sum().backward()
    assert block.weight.grad is None
    net = Net(dropout=0.0)
    apply_recompute(net, ["inp"], use_reentrant=True)
    with pytest.raises(TrainingError, match="reentrant recompute of Linear would give its parameters no gradient"):
        net(paddle.ones([2, 8]))
    net.eval()
    net(paddle.ones([2, 8]))  # evaluation runs the plain forward: nothing to refuse


def test_a_paddlenlp_model_is_switched_through_its_own_enable_recompute(tmp_path):
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)

    def recompute(model):
        assert apply_recompute(model) >= 1
        assert model.llama.enable_recompute is True

    ids = paddle.to_tensor(np.random.RandomState(0).randint(0, 64, (2, 12)))
    plain, recomputed = (_paddlenlp_grads(lambda: LlamaForCausalLM(config), lambda m: m(input_ids=ids, labels=ids)[0], r)
                         for r in (None, recompute))
    assert len(plain) == len(recomputed) > 0
    assert max(float(np.abs(a - b).max()) for a, b in zip(plain, recomputed)) == 0.0


def _paddlenlp_grads(build, loss_of, recompute=None):
    """The gradients of ``loss_of(model)`` for ``build()`` (seeded alike), ``recompute(model)`` applied first if given;
    the same dropout masks in every call."""
    paddle.seed(2)
    model = build()
    if recompute is not None:
        recompute(model)
    model.train()
    paddle.seed(5)
    loss_of(model).backward()
    return [p.grad.numpy() for p in model.parameters() if p.grad is not None]


def test_named_blocks_of_paddlenlp_ernie_recompute_with_its_keyword_inputs_and_dropout():
    """PaddleNLP patches TransformerEncoderLayer.__setattr__ so that a new ``forward`` is called as an unbound
    function (with the layer as its first input): the wrapped forward goes in past it, and ERNIE's encoder calls
    its layers with keywords (``src_mask=``, ``cache=``, ``output_attentions=``)."""
    from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification

    config = ErnieConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3)

    def recompute(model):
        assert apply_recompute(model, ["TransformerEncoderLayer"]) == 2

    ids = paddle.to_tensor(np.random.RandomState(0).randint(1, 64, (2, 12)))
    plain, recomputed = (_paddlenlp_grads(lambda: ErnieForSequenceClassification(config),
                                          lambda m: m(ids).square().mean(), r) for r in (None, recompute))
    assert len(plain) == len(recomputed) > 30
    assert max(float(np.abs(a - b).max()) for a, b in zip(plain, recomputed)) == 0.0
