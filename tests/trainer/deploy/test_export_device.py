"""Export on the training device: the device/tolerance decision, and an AMP O2 (bfloat16) model."""

import json
import os

import numpy as np
import paddle
from helpers import ToyDataset

from trainer import Trainer, TrainingArguments
from trainer.deploy.export import check_settings
from trainer.deploy.predictor import create_predictor, run_predictor


def test_check_runs_on_the_training_device_with_its_tolerance():
    assert check_settings("gpu:3") == ("gpu:3", 1e-2, 1e-2)  # the card it trained on, not a CPU predictor
    assert check_settings("gpu:0", rtol=1e-4, atol=0.05) == ("gpu:0", 1e-2, 0.05)  # a CPU tolerance is raised
    assert check_settings("cpu", rtol=1e-4) == ("cpu", 1e-4, 1e-5)
    assert check_settings("cpu") == ("cpu", 1e-5, 1e-5)


class O2Net(paddle.nn.Layer):
    """As AMP O2 leaves a model: Linear weights in bfloat16, BatchNorm in float32."""

    def __init__(self):
        super().__init__()
        paddle.seed(1)
        self.fc1, self.bn, self.fc2 = paddle.nn.Linear(8, 16), paddle.nn.BatchNorm1D(16), paddle.nn.Linear(16, 3)
        self.fc1.to(dtype="bfloat16")
        self.fc2.to(dtype="bfloat16")

    def forward(self, x):
        h = self.fc1(x.astype(self.fc1.weight.dtype))
        h = paddle.nn.functional.relu(self.bn(h.astype("float32")))
        return self.fc2(h.astype(self.fc2.weight.dtype))


def test_o2_bfloat16_model_exports_a_float32_copy(tmp_path):
    model = O2Net()
    data = ToyDataset(12)
    trainer = Trainer(model, TrainingArguments(output_dir=str(tmp_path), report_to=[]), eval_dataset=data)
    path = trainer.export()
    assert model.fc1.weight.dtype == paddle.bfloat16  # the trained model is untouched
    with open(os.path.join(path, "export.json")) as f:
        report = json.load(f)
    assert report["device"] == "cpu" and report["rtol"] == 1e-5
    assert report["outputs"][0]["dtype"] == "float32"
    (got,) = run_predictor(create_predictor(path), [data.x[:5]])
    assert got.dtype == np.float32
    twin = O2Net()  # the same bf16-valued weights in float32 (paddle's CPU build has no bf16 matmul)
    twin.to(dtype="float32")
    twin.set_state_dict({k: v.astype("float32") for k, v in model.state_dict().items()})
    twin.eval()
    with paddle.no_grad():
        reference = twin(paddle.to_tensor(data.x[:5])).numpy()
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)
