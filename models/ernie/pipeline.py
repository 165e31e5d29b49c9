"""The ERNIE classifier as a pipeline: paddle's ``PipelineLayer`` of ``LayerDesc`` s, for ``pipeline_parallel_degree > 1``.

The same network as paddlenlp's ``ErnieForSequenceClassification`` (``models.ernie.model``), cut into a list of
layers that fleet spreads over the stages: the embeddings (which also build the attention mask), one layer per
transformer block, and the head (pooler, dropout, classifier). Between stages travel ``(hidden, mask)``; the
head gives the logits and ``loss_fn`` (cross entropy) turns them into the loss on the last stage.

Each stage builds only its own layers (``LayerDesc``); paddle seeds each layer's initialisation by its index, so
the initial weights do not depend on the number of stages. Parameter names are the single-card model's
(:meth:`ErniePipe.single_card_names`), so checkpoints move between this model and ``ErnieForSequenceClassification``
(pp 2 -> 1 -> 2) and export writes the single-card inference model.

A sketch (under ``fleet.init`` with ``pp_degree=2``; ``TrainingArguments(pipeline_parallel_degree=2)`` does it)::

    model = ErniePipe(scratch_config("tiny", vocab_size=100, num_labels=2, max_position=64, dropout=0.0),
                      num_stages=2)
"""

from __future__ import annotations

from collections.abc import Mapping

import paddle
from paddle import nn
from paddle.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer


def _weight_attr(config):
    return paddle.ParamAttr(initializer=nn.initializer.TruncatedNormal(mean=0.0, std=config.initializer_range))


def _layer_norm_eps(layer: nn.Layer, config) -> nn.Layer:
    """paddlenlp's ERNIE sets every LayerNorm's epsilon to ``layer_norm_eps`` (1e-12) when it initialises the
    weights (``_init_weights``: ``layer._epsilon``); the stages, built outside it, do the same."""
    for sub in layer.sublayers(include_self=True):
        if isinstance(sub, nn.LayerNorm):
            sub._epsilon = config.layer_norm_eps
    return layer


class ErnieEmbeddingPipe(nn.Layer):
    """Layer 0: ``(input_ids, token_type_ids)`` (or the batch's dict) -> ``(hidden, mask)``."""

    def __init__(self, config):
        from paddlenlp.transformers.ernie.modeling import ErnieEmbeddings

        super().__init__()
        self.pad_token_id = config.pad_token_id
        self.embeddings = _layer_norm_eps(ErnieEmbeddings(config=config, weight_attr=_weight_attr(config)), config)

    def forward(self, inputs):
        if isinstance(inputs, Mapping):
            input_ids, token_type_ids = inputs["input_ids"], inputs.get("token_type_ids")
        elif isinstance(inputs, (list, tuple)):
            input_ids, token_type_ids = inputs[0], (inputs[1] if len(inputs) > 1 else None)
        else:
            input_ids, token_type_ids = inputs, None
        # as ErnieModel builds it: -1e4 where the token is padding, added to the attention scores
        mask = paddle.unsqueeze((input_ids == self.pad_token_id).astype("float32") * -1e4, axis=[1, 2])
        mask.stop_gradient = True
        return self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids), mask


class ErnieBlockPipe(nn.Layer):
    """Layers 1..N: one transformer block (paddle's ``TransformerEncoderLayer``, as ErnieModel's encoder holds)."""

    def __init__(self, config):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            config.hidden_size, config.num_attention_heads, config.intermediate_size,
            dropout=config.hidden_dropout_prob, activation=config.hidden_act,
            attn_dropout=config.attention_probs_dropout_prob, act_dropout=0, weight_attr=_weight_attr(config),
            normalize_before=False, layer_norm_eps=config.layer_norm_eps)

    def forward(self, args):
        hidden, mask = args
        return self.layer(hidden, src_mask=mask), mask


class ErnieHeadPipe(nn.Layer):
    """The last layer: pooler (first token, dense, tanh), dropout, classifier -> logits."""

    def __init__(self, config):
        from paddlenlp.transformers.ernie.modeling import ErniePooler

        super().__init__()
        self.pooler = ErniePooler(config, _weight_attr(config))
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, args):
        hidden, _ = args
        return self.classifier(self.dropout(self.pooler(hidden)))


class ErnieClassificationLoss(nn.Layer):
    """Cross entropy of the logits against the labels (the loss ``ErnieForSequenceClassification`` computes)."""

    def forward(self, logits, labels):
        return nn.functional.cross_entropy(logits.reshape([-1, logits.shape[-1]]), labels.reshape([-1]))


class ErniePipe(PipelineLayer):
    """ERNIE classifier over ``num_stages`` pipeline stages (each rank builds its stage's layers only)."""

    def __init__(self, config, num_stages: int, **kwargs):
        layers = [LayerDesc(ErnieEmbeddingPipe, config=config)]
        layers += [LayerDesc(ErnieBlockPipe, config=config) for _ in range(config.num_hidden_layers)]
        layers.append(LayerDesc(ErnieHeadPipe, config=config))
        super().__init__(layers=layers, num_stages=num_stages, loss_fn=ErnieClassificationLoss(),
                         seg_method=kwargs.pop("seg_method", "uniform"), **kwargs)
        self.config, self.num_blocks = config, config.num_hidden_layers

    @classmethod
    def from_single_card(cls, model, num_stages: int, **kwargs) -> "ErniePipe":
        """This stage of ``model`` (an ``ErnieForSequenceClassification``, e.g. a pretrained one): its layers get
        the single-card model's weights."""
        pipe = cls(model.config, num_stages=num_stages, **kwargs)
        weights = model.state_dict()
        pipe.set_state_dict({name: weights[whole] for name, whole in pipe.single_card_names().items()})
        return pipe

    def single_card_model(self):
        """A new ``ErnieForSequenceClassification`` of this shape (export puts every stage's weights into it)."""
        from .model import build_scratch_model

        return build_scratch_model(self.config)

    def single_card_names(self) -> dict:
        """``{this stage's structured name: ErnieForSequenceClassification's name}`` for every parameter and buffer
        this stage holds (what checkpoints and export use; see ``trainer.parallel.pipeline``)."""
        out = {}
        last = self.num_blocks + 1
        for name in self.state_dict():
            index, rest = name.split(".", 1)
            index = int(index)
            if index == 0:
                out[name] = "ernie." + rest  # embeddings.*
            elif index < last:
                out[name] = f"ernie.encoder.layers.{index - 1}." + rest[len("layer."):]
            elif rest.startswith("pooler."):
                out[name] = "ernie." + rest
            else:
                out[name] = rest  # classifier.*
        return out
