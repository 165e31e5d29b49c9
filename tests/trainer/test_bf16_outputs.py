"""bf16 logits: evaluation, predict and the host conversion read values, not raw bits."""

import numpy as np
import paddle
from helpers import ToyDataset, make_mlp

from models.resnet.metrics import classification_metrics
from trainer import Trainer, TrainingArguments
from trainer.tensors import to_numpy


class Logits(paddle.nn.Layer):
    """The MLP with its logits rounded to bfloat16, returned as bf16 or as float32 (same values)."""

    def __init__(self, bf16: bool):
        super().__init__()
        self.mlp, self.bf16 = make_mlp(seed=3, classes=6), bf16

    def forward(self, x):
        logits = self.mlp(x).astype("bfloat16")
        return logits if self.bf16 else logits.astype("float32")


def _loss(logits, labels):
    return paddle.nn.functional.cross_entropy(logits.astype("float32"), labels)


def _metrics(pred):
    assert pred.predictions.dtype == np.float32
    return classification_metrics(pred, k=3)


def _run(tmp_path, bf16: bool):
    data = ToyDataset(29, seed=4)
    data.y = (np.abs(data.x[:, 0]) * 3).astype("int64") % 6
    trainer = Trainer(Logits(bf16), TrainingArguments(output_dir=str(tmp_path / str(bf16)), report_to=[],
                                                      per_device_eval_batch_size=8),
                      eval_dataset=data, loss_fn=_loss, compute_metrics=_metrics)
    return trainer.evaluate(), trainer.predict(data)


def test_bf16_logits_give_the_float32_metrics_and_predictions(tmp_path):
    metrics16, out16 = _run(tmp_path, bf16=True)
    metrics32, out32 = _run(tmp_path, bf16=False)
    assert 0.0 < metrics32["eval_accuracy"] < 1.0
    assert _untimed(metrics16) == _untimed(metrics32)
    assert out16.predictions.dtype == np.float32
    np.testing.assert_array_equal(out16.predictions, out32.predictions)
    assert _untimed(out16.metrics) == _untimed(out32.metrics)


def test_to_numpy_casts_low_precision_and_keeps_the_rest():
    values = paddle.to_tensor([-2.0, 1.0, 3.0])
    assert values.astype("bfloat16").numpy().dtype == np.uint16  # what paddle gives: raw bits
    got = to_numpy({"a": values.astype("bfloat16"), "b": [values.astype("float16"), paddle.to_tensor([1, 2])]})
    assert got["a"].dtype == np.float32 and got["a"].tolist() == [-2.0, 1.0, 3.0]
    assert got["b"][0].dtype == np.float32 and got["b"][1].dtype == np.int64
    assert to_numpy(values.astype("float16"), keep_float16=True).dtype == np.float16
    assert to_numpy(None) is None


def _untimed(metrics: dict) -> dict:
    """The metrics without eval_runtime and the *_per_second rates, which differ from run to run."""
    return {k: v for k, v in metrics.items() if not k.endswith(("_runtime", "_per_second"))}
