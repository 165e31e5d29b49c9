"""A tensor-parallel ERNIE-style classifier: fleet's parallel layers where paddlenlp 2.8.1's ERNIE has none.

paddlenlp 2.8.1's ``ErnieModel`` ignores ``tensor_parallel_degree`` (its layers are plain ``nn.Linear``), so
the ERNIE task builds this encoder when ``tensor_parallel_degree`` > 1: the ERNIE architecture (word, position
and token-type embeddings, post-norm transformer layers with GELU, a tanh pooler over the first token and a
linear classifier) with Megatron's split:

* the word embedding is a ``VocabParallelEmbedding`` (rows split over the tensor-parallel ranks);
* each attention's fused q/k/v projection a ``ColumnParallelLinear`` (each rank computes its
  ``heads / degree`` heads; their weights are laid out head by head: q, k, v of head 0, then head 1, ...) and
  its output projection a ``RowParallelLinear`` (the partial sums are added over the group);
* each feed-forward block a ``ColumnParallelLinear`` then a ``RowParallelLinear``;
* everything else (norms, position embeddings, pooler, classifier) is whole on every rank.

The attention-probability dropout acts on each rank's own heads, so it draws from fleet's model-parallel RNG
tracker (``get_rng_state_tracker().rng_state()``: seeded per rank); the other dropouts act on tensors every
rank of the group holds whole and draw from the global generator, which fleet seeds alike on all of them.

With a degree of 1 the same class builds plain ``nn.Embedding`` / ``nn.Linear`` layers with the same parameter
names and the whole shapes: :meth:`ErnieTPForSequenceClassification.single_card_model` is that model, what an
export of a tensor-parallel run merges its slices into.

    >>> cfg = ErnieTPConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
    ...                     intermediate_size=16, num_labels=3)
    >>> model = ErnieTPForSequenceClassification(cfg)
    >>> import paddle
    >>> list(model(paddle.to_tensor([[5, 6, 0]])).shape)
    [1, 3]
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import paddle
import paddle.nn.functional as F
from paddle import nn


@dataclass
class ErnieTPConfig:
    vocab_size: int
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 256
    max_position_embeddings: int = 128
    type_vocab_size: int = 2
    num_labels: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    pad_token_id: int = 0
    hidden_act: str = "gelu"    # or "relu"
    tensor_parallel_degree: int = 1


def _parallel(config: ErnieTPConfig) -> bool:
    return config.tensor_parallel_degree > 1


def _column(config, n_in, n_out):
    if _parallel(config):
        from paddle.distributed.fleet.meta_parallel import ColumnParallelLinear

        return ColumnParallelLinear(n_in, n_out, gather_output=False, has_bias=True)
    return nn.Linear(n_in, n_out)


def _row(config, n_in, n_out):
    if _parallel(config):
        from paddle.distributed.fleet.meta_parallel import RowParallelLinear

        return RowParallelLinear(n_in, n_out, input_is_parallel=True, has_bias=True)
    return nn.Linear(n_in, n_out)


class _Attention(nn.Layer):
    def __init__(self, config: ErnieTPConfig):
        super().__init__()
        self.heads = config.num_attention_heads // config.tensor_parallel_degree  # this rank's heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.qkv = _column(config, config.hidden_size, 3 * config.hidden_size)
        self.out = _row(config, config.hidden_size, config.hidden_size)
        self.dropout = config.attention_probs_dropout_prob
        self.parallel = _parallel(config)

    def forward(self, x, mask):
        b, s = x.shape[0], x.shape[1]
        qkv = self.qkv(x).reshape([b, s, self.heads, 3, self.head_dim]).transpose([3, 0, 2, 1, 4])
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = paddle.matmul(q, k, transpose_y=True) * (self.head_dim ** -0.5) + mask
        probs = F.softmax(scores, axis=-1)
        if self.training and self.dropout:
            if self.parallel:  # each rank holds other heads: its own stream of the model-parallel RNG tracker
                from paddle.distributed.fleet.meta_parallel import get_rng_state_tracker

                with get_rng_state_tracker().rng_state():
                    probs = F.dropout(probs, self.dropout, training=True)
            else:
                probs = F.dropout(probs, self.dropout, training=True)
        context = paddle.matmul(probs, v).transpose([0, 2, 1, 3]).reshape([b, s, self.heads * self.head_dim])
        return self.out(context)


class _Layer(nn.Layer):
    def __init__(self, config: ErnieTPConfig):
        super().__init__()
        self.attention = _Attention(config)
        self.norm1 = nn.LayerNorm(config.hidden_size)
        self.ffn_in = _column(config, config.hidden_size, config.intermediate_size)
        self.ffn_out = _row(config, config.intermediate_size, config.hidden_size)
        self.norm2 = nn.LayerNorm(config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.act = getattr(F, config.hidden_act)

    def forward(self, x, mask):
        x = self.norm1(x + self.dropout(self.attention(x, mask)))
        return self.norm2(x + self.dropout(self.ffn_out(self.act(self.ffn_in(x)))))


class ErnieTPForSequenceClassification(nn.Layer):
    """ERNIE-style encoder + classifier, tensor parallel over fleet's model-parallel group when
    ``config.tensor_parallel_degree`` > 1 (build it after ``fleet.init``: ``TrainingArguments`` does it).

    ``forward(input_ids, token_type_ids=None, labels=None)``: the logits, or ``(loss, logits)`` with labels,
    as paddlenlp's classifiers return them."""

    def __init__(self, config: ErnieTPConfig):
        super().__init__()
        degree = config.tensor_parallel_degree
        for name, value in (("num_attention_heads", config.num_attention_heads),
                            ("intermediate_size", config.intermediate_size), ("vocab_size", config.vocab_size)):
            if value % degree:
                raise ValueError(f"{name}={value} does not split over tensor_parallel_degree={degree}")
        self.config = config
        if _parallel(config):
            from paddle.distributed.fleet.meta_parallel import VocabParallelEmbedding

            self.word_embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        else:
            self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.embedding_norm = nn.LayerNorm(config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.layers = nn.LayerList([_Layer(config) for _ in range(config.num_hidden_layers)])
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids, token_type_ids=None, labels=None):
        if token_type_ids is None:
            token_type_ids = paddle.zeros_like(input_ids)
        positions = paddle.arange(input_ids.shape[1], dtype="int64").unsqueeze(0)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + \
            self.token_type_embeddings(token_type_ids)
        x = self.dropout(self.embedding_norm(x))
        mask = ((input_ids == self.config.pad_token_id).astype(x.dtype) * -1e4).unsqueeze([1, 2])
        for layer in self.layers:
            x = layer(x, mask)
        logits = self.classifier(self.dropout(paddle.tanh(self.pooler(x[:, 0]))))
        if labels is None:
            return logits
        return F.cross_entropy(logits, labels.reshape([-1])), logits

    def single_card_model(self) -> "ErnieTPForSequenceClassification":
        """The same architecture on one card (plain layers, whole shapes, the same parameter names): what the
        merged weights of a tensor-parallel run load into for export (``trainer.layout.merge``)."""
        config = copy.copy(self.config)
        config.tensor_parallel_degree = 1
        return ErnieTPForSequenceClassification(config)
