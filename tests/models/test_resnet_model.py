"""ResNet task model and metrics: zero-init, no weight decay on BatchNorm and biases
(measured on a real optimizer step), local pretrained weights, top-k numerics,
and a few real training steps through the Trainer."""

import os

import numpy as np
import paddle
import pytest

from models.resnet.metrics import classification_metrics, topk_accuracy
from models.resnet.model import build_resnet, decay_parameter_names, last_block_norms, load_pretrained
from trainer import Trainer, TrainingArguments
from trainer.errors import ConfigError
from trainer import EvalPrediction


# ---- model ---------------------------------------------------------------------------
def test_depths_and_zero_init_of_the_last_norm_in_every_block():
    paddle.seed(0)
    r18 = build_resnet(18, num_classes=10, zero_init_residual=True)
    norms = last_block_norms(r18)
    assert len(norms) == 8 and all(float(n.weight.abs().sum()) == 0 for n in norms)
    assert float(r18.bn1.weight.min()) == 1.0  # other norms keep gamma = 1
    r50 = build_resnet(50, num_classes=10, zero_init_residual=True)
    assert len(last_block_norms(r50)) == 16 and all(float(n.weight.abs().sum()) == 0 for n in last_block_norms(r50))
    assert sum(int(np.prod(p.shape)) for p in r50.parameters() if not p.stop_gradient) == 23528522  # torchvision's count
    assert all(float(n.weight.min()) == 1.0 for n in last_block_norms(build_resnet(18, 10)))
    with pytest.raises(ConfigError, match="depth=20"):
        build_resnet(20)


@pytest.mark.parametrize("optim", ["momentum", "adamw"])
def test_weight_decay_skips_batchnorm_and_biases(tmp_path, optim):
    """A step with zero gradients changes a parameter only through weight decay:
    conv kernels and the fc matrix shrink by (1 - lr * wd); BatchNorm gamma/beta and
    the fc bias stay exactly as they were."""
    paddle.seed(0)
    model = build_resnet(18, num_classes=10)
    for _, p in model.named_parameters():  # give 1-D parameters values decay would visibly change
        if p.ndim == 1:
            p.set_value(paddle.full_like(p, 0.5))
    lr, wd = 0.1, 0.01
    args = TrainingArguments(output_dir=str(tmp_path), optim=optim, learning_rate=lr, weight_decay=wd,
                             report_to=[], save_strategy="no", evaluation_strategy="no")
    trainer = Trainer(model, args)
    optimizer = trainer.create_optimizer()
    before = {n: p.numpy().copy() for n, p in model.named_parameters()}
    loss = (model(paddle.randn([2, 3, 32, 32])) * 0).sum()
    loss.backward()
    optimizer.step()
    decayed = set(decay_parameter_names(model))
    assert len(decayed) == 21 and "fc.weight" in decayed and "fc.bias" not in decayed
    for name, p in model.named_parameters():
        if p.stop_gradient:  # BatchNorm running statistics: not optimized at all
            continue
        if name in decayed:
            np.testing.assert_allclose(p.numpy(), before[name] * (1 - lr * wd), rtol=1e-5, atol=1e-7, err_msg=name)
        else:
            assert "bn" in name or "downsample.1" in name or name == "fc.bias", name
            np.testing.assert_array_equal(p.numpy(), before[name], err_msg=name)


def _save(model, path):
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    if path.endswith(".safetensors"):
        from safetensors.numpy import save_file

        save_file(state, path)
    else:
        paddle.save(model.state_dict(), path)


@pytest.mark.parametrize("suffix", [".safetensors", ".pdparams"])
def test_pretrained_weights_from_a_local_file_keep_all_but_a_mismatched_classifier(tmp_path, suffix):
    paddle.seed(1)
    source = build_resnet(18, num_classes=1000)
    path = str(tmp_path / f"r18{suffix}")
    _save(source, path)
    paddle.seed(2)
    target = build_resnet(18, num_classes=10)
    counts = load_pretrained(target, path, depth=18)
    assert counts == {"pretrained_tensors": 100, "reinitialized_tensors": 2}  # 102 tensors incl. running stats
    np.testing.assert_array_equal(target.conv1.weight.numpy(), source.conv1.weight.numpy())
    np.testing.assert_array_equal(target.layer4[1].bn2._mean.numpy(), source.layer4[1].bn2._mean.numpy())
    assert target.fc.weight.shape == [512, 10]
    same = build_resnet(18, num_classes=1000)
    load_pretrained(same, path, depth=18)
    np.testing.assert_array_equal(same.fc.weight.numpy(), source.fc.weight.numpy())


def test_pretrained_errors_are_one_line(tmp_path, monkeypatch):
    path = str(tmp_path / "r18.safetensors")
    _save(build_resnet(18, num_classes=10), path)
    with pytest.raises(ConfigError, match="ResNet-50"):
        load_pretrained(build_resnet(50, num_classes=10), path, depth=50)
    (tmp_path / "junk.pdparams").write_bytes(b"junk")
    with pytest.raises(ConfigError, match="cannot be read"):
        load_pretrained(build_resnet(18, 10), str(tmp_path / "junk.pdparams"), depth=18)
    import paddle.utils.download

    import models.resnet.data

    monkeypatch.setattr(paddle.utils.download, "WEIGHTS_HOME", str(tmp_path))  # nothing cached
    monkeypatch.setattr(models.resnet.data, "reachable", lambda host, port=443, timeout=3.0: False)  # no download
    with pytest.raises(ConfigError, match="cannot be reached") as info:
        load_pretrained(build_resnet(18, 10), "imagenet", depth=18)
    assert "--pretrained PATH" in str(info.value) and "\n" not in str(info.value)
    (tmp_path / "resnet18.pdparams").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match="cannot be read"):  # the cached file is used, not downloaded
        load_pretrained(build_resnet(18, 10), "imagenet", depth=18)


# ---- metrics -------------------------------------------------------------------------
def test_topk_numerics_by_hand_and_against_a_sort():
    logits = np.array([[0.1, 0.5, 0.2, 0.9, 0.0, 0.3],    # label 1 is 2nd
                       [0.1, 0.5, 0.2, 0.9, 0.0, 0.3],    # label 4 is 6th (last)
                       [1.0, 0.0, 0.0, 0.0, 0.0, 0.0],    # label 0 is 1st
                       [0.2, 0.2, 0.2, 0.2, 0.2, 0.2]])   # all tied: counts at any k
    labels = np.array([1, 4, 0, 3])
    assert topk_accuracy(logits, labels, 1) == 0.5
    assert topk_accuracy(logits, labels, 2) == 0.75
    assert topk_accuracy(logits, labels, 5) == 0.75
    assert topk_accuracy(logits, labels, 6) == 1.0
    rng = np.random.RandomState(0)
    logits, labels = rng.randn(1000, 100), rng.randint(0, 100, 1000)
    order = np.argsort(-logits, axis=1)
    for k in (1, 5, 10):
        by_sort = float(np.mean([labels[i] in order[i, :k] for i in range(1000)]))
        assert topk_accuracy(logits, labels, k) == by_sort
    metrics = classification_metrics(EvalPrediction(logits, labels))
    assert set(metrics) == {"accuracy", "top5_accuracy"} and metrics["accuracy"] == topk_accuracy(logits, labels, 1)


def test_topk_over_uneven_shards_equals_topk_over_the_whole_set():
    """What the Trainer gathers from 3 ranks holding 4, 3 and 3 samples, in order, equals the whole set."""
    rng = np.random.RandomState(1)
    logits, labels = rng.randn(10, 7), rng.randint(0, 7, 10)
    shards = [(logits[a:b], labels[a:b]) for a, b in ((0, 4), (4, 7), (7, 10))]
    gathered = np.concatenate([s[0] for s in shards]), np.concatenate([s[1] for s in shards])
    whole = [topk_accuracy(logits, labels, k) for k in (1, 5)]
    assert [topk_accuracy(*gathered, k) for k in (1, 5)] == whole
    mean_of_shards = np.mean([topk_accuracy(x, y, 1) for x, y in shards])
    assert mean_of_shards != whole[0]  # why gathering matters: averaging per-shard accuracies is wrong here


# ---- a few real steps ----------------------------------------------------------------------
def test_a_tiny_resnet18_learns_a_few_digits_through_the_trainer(tmp_path):
    from models.resnet.data import ArrayImageDataset, render_digits

    images, labels = render_digits(32)
    pick = np.concatenate([np.flatnonzero(labels == c)[:4] for c in range(4)])  # 16 images, 4 classes
    dataset = ArrayImageDataset(images[pick], labels[pick])
    paddle.seed(0)
    model = build_resnet(18, num_classes=4)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=16, max_steps=8,
                             learning_rate=2e-3, logging_steps=1, report_to=[], save_strategy="no",
                             evaluation_strategy="no", seed=0)
    trainer = Trainer(model, args, train_dataset=dataset, loss_fn=paddle.nn.CrossEntropyLoss())
    state = trainer.fit()
    losses = [r["loss"] for r in state.log_history if "loss" in r]
    assert state.status == "completed" and len(losses) == 8
    assert np.mean(losses[-2:]) < 0.5 * np.mean(losses[:2]), losses


def test_docstring_examples_run():
    import doctest

    import models.resnet.metrics
    import models.resnet.transforms

    for module in (models.resnet.metrics, models.resnet.transforms):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
