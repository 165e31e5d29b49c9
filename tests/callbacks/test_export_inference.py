"""Export: real paddle.jit.save exports, loaded back with paddle.inference and compared with the dygraph model."""

import doctest
import json
import os

import numpy as np
import paddle
import paddle.inference as paddle_infer
import pytest
from helpers import ToyDataset, make_mlp
from paddle.static import InputSpec

import callbacks.export
from callbacks import Callback, Export
from trainer import Trainer, TrainingArguments
from trainer.errors import CallbackError, ConfigError, DataError, TrainingError
from trainer.deploy.export import export_inference_model
from trainer.deploy.predictor import create_predictor, model_files, run_predictor


def args(out, **kw):
    values = dict(output_dir=str(out), per_device_train_batch_size=8, max_steps=6, learning_rate=0.05,
                  report_to=[], evaluation_strategy="no", save_strategy="no")
    values.update(kw)
    return TrainingArguments(**values)


def deployed(path, *inputs):
    """Outputs of the export in ``path`` through a plain paddle.inference Config(model_file, params_file)."""
    model_file, params_file = model_files(path)
    config = paddle_infer.Config(model_file, params_file)
    config.disable_gpu()
    config.disable_glog_info()
    predictor = paddle_infer.create_predictor(config)
    for name, value in zip(predictor.get_input_names(), inputs):
        handle = predictor.get_input_handle(name)
        handle.reshape(list(value.shape))
        handle.copy_from_cpu(np.ascontiguousarray(value))
    predictor.run()
    return [predictor.get_output_handle(n).copy_to_cpu() for n in predictor.get_output_names()]


def dygraph(model, *inputs):
    model.eval()
    with paddle.no_grad():
        return model(*[paddle.to_tensor(x) for x in inputs]).numpy()


def test_mlp_export_matches_dygraph(tmp_path):
    t = Trainer(make_mlp(), args(tmp_path), train_dataset=ToyDataset(64), eval_dataset=ToyDataset(16, seed=1),
                loss_fn=paddle.nn.CrossEntropyLoss())
    t.fit()
    path = t.export()
    assert path == str(tmp_path / "inference")
    assert sorted(os.listdir(path)) == ["export.json", "model.json", "model.pdiparams"]  # paddle 3.3.1 writes PIR JSON
    x = ToyDataset(16, seed=7).x
    for rows in (1, 5, 16):  # the batch dimension is dynamic
        (out,) = deployed(path, x[:rows])
        np.testing.assert_allclose(out, dygraph(t.model, x[:rows]), rtol=1e-5, atol=1e-6)
    with open(os.path.join(path, "export.json")) as f:
        report = json.load(f)
    print("MLP export max abs diff:", report["max_abs_diff"])
    assert report["inputs"] == [{"name": "input", "shape": [-1, 8], "dtype": "float32"}]
    assert report["model_file"] == "model.json" and report["sample_rows"] == 4 and report["max_abs_diff"] < 1e-5
    assert report["paddle"] == paddle.__version__
    t.model.train()
    t.args.max_steps = 8
    assert t.fit().global_step == 8  # training goes on in dygraph after an export


class SmallConvNet(paddle.nn.Layer):
    def __init__(self, classes=3):
        super().__init__()
        self.features = paddle.nn.Sequential(
            paddle.nn.Conv2D(1, 8, 3, padding=1), paddle.nn.BatchNorm2D(8), paddle.nn.ReLU(), paddle.nn.MaxPool2D(2),
            paddle.nn.Conv2D(8, 8, 3, padding=1), paddle.nn.BatchNorm2D(8), paddle.nn.ReLU())
        self.head = paddle.nn.Linear(8, classes)

    def forward(self, image):
        h = self.features(image)
        return self.head(h.mean(axis=[2, 3]))


class Images(paddle.io.Dataset):
    def __init__(self, n=32, seed=0):
        rng = np.random.RandomState(seed)
        self.x = rng.rand(n, 1, 12, 12).astype("float32")
        self.y = (self.x.mean(axis=(1, 2, 3)) * 6).astype("int64") % 3

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def test_conv_net_with_batch_norm_export_matches(tmp_path):
    paddle.seed(0)
    model = SmallConvNet()
    t = Trainer(model, args(tmp_path), train_dataset=Images(), loss_fn=paddle.nn.CrossEntropyLoss())
    t.fit()  # BatchNorm running statistics moved: the export must use them (eval mode)
    x = Images(9, seed=3).x
    assert t.model.training
    path = t.export(str(tmp_path / "given-spec"), input_spec=[InputSpec([None, 1, 12, 12], "float32", "image")])
    assert t.model.training  # export puts the model back in the mode it found it in
    (out,) = deployed(path, x)
    diff = float(np.abs(out - dygraph(t.model, x)).max())
    print("conv export max abs diff:", diff)
    np.testing.assert_allclose(out, dygraph(t.model, x), rtol=1e-5, atol=1e-5)
    inferred = t.export(str(tmp_path / "inferred"))  # spec read off the train dataset
    with open(os.path.join(inferred, "export.json")) as f:
        assert json.load(f)["inputs"] == [{"name": "image", "shape": [-1, 1, 12, 12], "dtype": "float32"}]


class KeywordModel(paddle.nn.Layer):
    """Takes dict batches, like paddlenlp models: forward(input_ids, token_type_ids=None, attention_mask=None, labels=None)."""

    def __init__(self):
        super().__init__()
        self.emb = paddle.nn.Embedding(20, 8)
        self.fc = paddle.nn.Linear(8, 2)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None):
        mask = attention_mask.astype("float32").unsqueeze(-1)
        h = (self.emb(input_ids) * mask).sum(1) / mask.sum(1)
        return {"logits": self.fc(h), "pooled": h}


class Texts(paddle.io.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        ids = np.arange(i, i + 6, dtype="int64") % 20
        return {"input_ids": ids, "attention_mask": np.ones(6, "int64"), "labels": np.int64(i % 2)}


def test_dict_batches_export_with_dynamic_sequence_length(tmp_path):
    paddle.seed(0)
    model = KeywordModel()
    t = Trainer(model, args(tmp_path), train_dataset=Texts(), loss_fn=lambda out, y: paddle.nn.functional.cross_entropy(out["logits"], y))
    path = t.export()
    with open(os.path.join(path, "export.json")) as f:
        report = json.load(f)
    assert [i["name"] for i in report["inputs"]] == ["input_ids", "attention_mask"]
    assert report["inputs"][0]["shape"] == [-1, -1]  # integer inputs: batch and sequence length dynamic
    assert [o["key"] for o in report["outputs"]] == ["logits", "pooled"]  # dict outputs come sorted by key
    ids = np.random.RandomState(0).randint(0, 20, (3, 11)).astype("int64")
    mask = np.ones_like(ids)
    predictor = create_predictor(path)
    logits, pooled = run_predictor(predictor, [ids, mask], ["input_ids", "attention_mask"])
    model.eval()
    with paddle.no_grad():
        ref = model(input_ids=paddle.to_tensor(ids), attention_mask=paddle.to_tensor(mask))
    np.testing.assert_allclose(logits, ref["logits"].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pooled, ref["pooled"].numpy(), rtol=1e-5, atol=1e-6)


def test_export_callback_writes_the_files_at_fit_end(tmp_path):
    exporter = Export()
    t = Trainer(make_mlp(), args(tmp_path), train_dataset=ToyDataset(64), eval_dataset=ToyDataset(16, seed=1),
                loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[exporter])
    t.fit()
    path = str(tmp_path / "inference")
    assert exporter.result is not None and exporter.result.path == path
    assert os.path.isfile(os.path.join(path, "model.json")) and os.path.isfile(os.path.join(path, "model.pdiparams"))
    assert exporter.result.max_abs_diff < 1e-5
    print("Export callback max abs diff:", exporter.result.max_abs_diff)
    x = ToyDataset(16, seed=1).x
    np.testing.assert_allclose(deployed(path, x)[0], dygraph(t.model, x), rtol=1e-5, atol=1e-6)


def test_failed_run_exports_nothing(tmp_path):
    class Boom(Callback):
        def on_step_end(self, trainer):
            raise RuntimeError("boom")

    t = Trainer(make_mlp(), args(tmp_path), train_dataset=ToyDataset(64), loss_fn=paddle.nn.CrossEntropyLoss(),
                callbacks=[Export(), Boom()])
    with pytest.raises(CallbackError, match="boom"):
        t.fit()
    assert not os.path.exists(tmp_path / "inference")


class Drifting(paddle.nn.Layer):
    """Python-side state that paddle.jit bakes in at trace time: the export cannot match."""

    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(8, 2)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.fc(x) * float(self.calls)


def test_mismatch_raises_and_publishes_nothing(tmp_path):
    t = Trainer(Drifting(), args(tmp_path), train_dataset=ToyDataset(16), loss_fn=paddle.nn.CrossEntropyLoss())
    with pytest.raises(TrainingError, match=r"output 0 differs from the dygraph model's by up to .*not published"):
        t.export()
    assert not os.path.exists(tmp_path / "inference")
    assert [n for n in os.listdir(tmp_path) if n.startswith(".tmp")] == []


def test_needs_a_spec_or_data(tmp_path):
    t = Trainer(make_mlp(), args(tmp_path))
    with pytest.raises(ConfigError, match="export needs input_spec, a sample_batch, or a train/eval dataset"):
        t.export()
    # with a spec and no data, the check runs on synthetic inputs
    path = t.export(input_spec=[InputSpec([None, 8], "float32", "features")])
    assert deployed(path, np.ones((2, 8), "float32"))[0].shape == (2, 2)


def test_sample_batch_argument(tmp_path):
    t = Trainer(make_mlp(), args(tmp_path))
    x = paddle.randn([3, 8])
    path = export_inference_model(t, str(tmp_path / "exp"), sample_batch=(x, paddle.zeros([3], "int64")))
    np.testing.assert_allclose(deployed(path, x.numpy())[0], dygraph(t.model, x.numpy()), rtol=1e-5, atol=1e-6)


def test_only_the_main_process_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")
    t = Trainer(make_mlp(), args(tmp_path), train_dataset=ToyDataset(16))
    assert t.export() == str(tmp_path / "inference")
    assert not os.path.exists(tmp_path / "inference")


def test_loading_a_directory_without_an_export(tmp_path):
    with pytest.raises(DataError, match="holds no inference model"):
        create_predictor(str(tmp_path))


def test_docstring_example():
    assert doctest.testmod(callbacks.export).failed == 0


def test_unconvertible_input_is_a_training_error(tmp_path):
    t = Trainer(make_mlp(), args(tmp_path))
    with pytest.raises(TrainingError, match=r"paddle.jit.save could not convert Sequential.forward"):
        t.export(input_spec=[InputSpec([None, 8], "float32", "a"), InputSpec([None, 8], "float32", "b")])
    assert not os.path.exists(tmp_path / "inference")
