"""The overhead workloads (and llama, for ``allreduce --recompute``): model, data, loss and optimizer, built the same
way for every training loop that is compared.

======== ======================================================== =================
name     model and data                                           optimizer
======== ======================================================== =================
mlp      Linear 128-64-ReLU-64-2; 16,000 random feature vectors,  AdamW lr 1e-3
         labels from a fixed random linear rule (learnable)
ernie    ErnieForSequenceClassification, ERNIE-style config       AdamW lr 1e-4
         (4 layers, hidden 256, 4 heads, FFN 1024, vocab 8,000,
         dropout 0), random token ids, batch 4 x sequence 128,
         labels from the tokens
resnet50 paddle.vision resnet50 (10 classes), batch 8 of random   Momentum lr 0.01
         3x32x32 images, random labels
llama    PaddleNLP's LlamaModel (4 layers, hidden 256, 4 heads,   AdamW lr 1e-4
         FFN 1024, vocab 8,000) + a linear head on the mean
         hidden state; ernie's data (``allreduce --recompute``:
         a PaddleNLP model with its own, non-reentrant, recompute)
======== ======================================================== =================

Everything is seeded: the model is built right after ``paddle.seed(seed)``,
the data come from ``numpy.random.RandomState(seed)``, and dropout is off, so
every loop that visits the batches in the same order ends with the same loss.
``BenchLoss`` keeps the last loss tensor (a reference, no device sync) so every
loop reports its final loss the same way.

``ernie`` imports paddlenlp (for the model), so on that workload every variant
pays for the paddlenlp import; on ``mlp`` and ``resnet50`` only the PaddleNLP
Trainer variant does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import paddle


@dataclass
class Workload:
    name: str
    batch_size: int
    input_name: str                 # the model's forward argument (PaddleNLP passes inputs by name)
    input_dtype: str
    input_shape: tuple              # one sample
    build_model: Callable[[], paddle.nn.Layer]
    build_dataset: Callable[[], paddle.io.Dataset]
    build_optimizer: Callable[[paddle.nn.Layer], paddle.optimizer.Optimizer]


class BenchLoss(paddle.nn.Layer):
    """Cross entropy that remembers its last value (a tensor reference: no sync)."""

    def __init__(self):
        super().__init__()
        self.ce = paddle.nn.CrossEntropyLoss()
        self._last = [None]  # a list: assigning a Layer attribute every step would go through Layer.__setattr__

    @property
    def last(self):
        return self._last[0]

    def forward(self, logits, labels):
        loss = self.ce(logits, labels)
        self._last[0] = loss
        return loss


class ArrayDataset(paddle.io.Dataset):
    """``(x[i], y[i])`` from two numpy arrays."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class DictView(paddle.io.Dataset):
    """The same samples as ``{input_name: x, "labels": y}`` (PaddleNLP's Trainer wants dicts)."""

    def __init__(self, dataset: ArrayDataset, input_name: str):
        self.dataset, self.input_name = dataset, input_name

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        x, y = self.dataset[i]
        return {self.input_name: x, "labels": y}


class MLP(paddle.nn.Layer):
    def __init__(self, features: int = 128, hidden: int = 64, classes: int = 2):
        super().__init__()
        self.fc1 = paddle.nn.Linear(features, hidden)
        self.fc2 = paddle.nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(paddle.nn.functional.relu(self.fc1(x)))


# ---- builders --------------------------------------------------------------------
def _mlp(seed: int, samples: int) -> Workload:
    def data():
        rng = np.random.RandomState(seed)
        x = rng.randn(samples, 128).astype("float32")
        w = rng.randn(128).astype("float32")
        return ArrayDataset(x, (x @ w > 0).astype("int64"))

    return Workload("mlp", 32, "x", "float32", (128,), lambda: MLP(), data,
                    lambda m: paddle.optimizer.AdamW(learning_rate=1e-3, parameters=m.parameters()))


ERNIE_CONFIG = dict(vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                    intermediate_size=1024, max_position_embeddings=512, type_vocab_size=2,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2)
SEQ_LEN = 128
ERNIE_BATCH = 4
RESNET_BATCH, RESNET_SIDE = 8, 32


def _ernie(seed: int, samples: int) -> Workload:
    def model():
        from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification

        return ErnieForSequenceClassification(ErnieConfig(**ERNIE_CONFIG))

    def data():
        rng = np.random.RandomState(seed)
        ids = rng.randint(1, ERNIE_CONFIG["vocab_size"], size=(samples, SEQ_LEN)).astype("int64")
        return ArrayDataset(ids, (ids[:, 1] % 2).astype("int64"))

    return Workload("ernie", ERNIE_BATCH, "input_ids", "int64", (SEQ_LEN,), model, data,
                    lambda m: paddle.optimizer.AdamW(learning_rate=1e-4, parameters=m.parameters()))


class LlamaClassifier(paddle.nn.Layer):
    """PaddleNLP's LlamaModel with a linear head on the mean of the last hidden states."""

    def __init__(self):
        super().__init__()
        from paddlenlp.transformers import LlamaConfig, LlamaModel

        self.llama = LlamaModel(LlamaConfig(
            vocab_size=ERNIE_CONFIG["vocab_size"], hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ_LEN))
        self.head = paddle.nn.Linear(256, 2)

    def forward(self, input_ids):
        return self.head(self.llama(input_ids=input_ids)[0].mean(axis=1))


def _llama(seed: int, samples: int) -> Workload:
    ernie = _ernie(seed, samples)
    return Workload("llama", ERNIE_BATCH, "input_ids", "int64", (SEQ_LEN,), LlamaClassifier, ernie.build_dataset,
                    lambda m: paddle.optimizer.AdamW(learning_rate=1e-4, parameters=m.parameters()))


def _resnet50(seed: int, samples: int) -> Workload:
    def data():
        rng = np.random.RandomState(seed)
        x = rng.randn(samples, 3, RESNET_SIDE, RESNET_SIDE).astype("float32")
        return ArrayDataset(x, rng.randint(0, 10, size=samples).astype("int64"))

    return Workload("resnet50", RESNET_BATCH, "x", "float32", (3, RESNET_SIDE, RESNET_SIDE),
                    lambda: paddle.vision.models.resnet50(num_classes=10), data,
                    lambda m: paddle.optimizer.Momentum(learning_rate=0.01, momentum=0.9, parameters=m.parameters()))


# samples per dataset: 500 MLP steps per epoch, 40 for the big ones (epoch boundaries happen in every window)
BUILDERS = {"mlp": (_mlp, 16000), "ernie": (_ernie, ERNIE_BATCH * 40), "resnet50": (_resnet50, RESNET_BATCH * 40),
            "llama": (_llama, ERNIE_BATCH * 40)}


def get_workload(name: str, seed: int = 0) -> Workload:
    if name not in BUILDERS:
        raise ValueError(f"unknown workload {name!r}: choose one of {', '.join(BUILDERS)}")
    builder, samples = BUILDERS[name]
    return builder(seed, samples)


def build(workload: Workload, seed: int):
    """``(model, dataset, optimizer)``: the model right after ``paddle.seed(seed)``."""
    dataset = workload.build_dataset()
    paddle.seed(seed)
    model = workload.build_model()
    return model, dataset, workload.build_optimizer(model)


def parameter_checksum(model: paddle.nn.Layer) -> float:
    """Sum of |parameter| over the model, in float64: equal sums, equal training."""
    return float(sum(np.abs(p.numpy().astype("float64")).sum() for p in model.parameters()))
