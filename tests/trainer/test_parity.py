"""The Trainer does what the hand-written loop does: same parameters after training."""

import numpy as np
import paddle
import pytest
from helpers import ToyDataset, make_mlp, params_of
from paddle.io import DataLoader, DistributedBatchSampler

from trainer import Trainer, TrainingArguments


def hand_written_loop(model, dataset, optimizer, epochs, batch_size=32):
    """The loop from the foundation issue (single process: no DataParallel needed)."""
    loader = DataLoader(dataset, batch_sampler=DistributedBatchSampler(dataset, batch_size=batch_size, shuffle=True))
    loss_fn = paddle.nn.CrossEntropyLoss()
    for _ in range(epochs):
        for data, label in loader:
            loss = loss_fn(model(data), label)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_trainer_with_user_optimizer_matches_hand_written_loop(tmp_path, opt_name):
    data = ToyDataset(100)  # 100 / 32: the last batch of each epoch is short
    make_opt = {"sgd": lambda m: paddle.optimizer.SGD(learning_rate=0.1, parameters=m.parameters()),
                "adam": lambda m: paddle.optimizer.Adam(learning_rate=0.01, parameters=m.parameters())}[opt_name]
    ref = make_mlp(seed=1)
    hand_written_loop(ref, data, make_opt(ref), epochs=3)

    model = make_mlp(seed=1)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=32, num_train_epochs=3)
    trainer = Trainer(model, args, train_dataset=data, loss_fn=paddle.nn.CrossEntropyLoss(), optimizer=make_opt(model))
    state = trainer.fit()
    assert state.status == "completed" and state.global_step == 12
    got, want = params_of(model), params_of(ref)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert any(not np.allclose(got[n], params_of(make_mlp(seed=1))[n]) for n in got), "the model did not train"


def test_gradient_accumulation_k4_equals_batch_4b(tmp_path):
    data = ToyDataset(64)

    def run(batch, k, sub):
        model = make_mlp(seed=2)
        args = TrainingArguments(output_dir=str(tmp_path / sub), per_device_train_batch_size=batch,
                                 gradient_accumulation_steps=k, num_train_epochs=2, report_to=[], save_strategy="no")
        trainer = Trainer(model, args, train_dataset=data, loss_fn=paddle.nn.CrossEntropyLoss(),
                          optimizer=paddle.optimizer.SGD(learning_rate=0.5, parameters=model.parameters()))
        state = trainer.fit()
        return params_of(model), state

    accumulated, s1 = run(4, 4, "acc")
    big, s2 = run(16, 1, "big")
    assert s1.global_step == s2.global_step == 8
    for name in big:
        np.testing.assert_allclose(accumulated[name], big[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_uneven_tail_of_accumulation_is_weighted_by_its_micro_batches(tmp_path):
    # 5 batches with k=2: steps of 2, 2 and 1 micro-batches; the last step's loss is not halved.
    data = ToyDataset(20)
    seen = []

    from callbacks import Callback

    class Record(Callback):
        def on_backward_begin(self, trainer):
            seen.append(trainer.state.num_micro_batches)

    model = make_mlp(seed=3)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             num_train_epochs=1, report_to=[], save_strategy="no")
    Trainer(model, args, train_dataset=data, loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[Record()]).fit()
    assert seen == [2, 2, 2, 2, 1]


def test_clipping_bounds_the_update(tmp_path):
    data = ToyDataset(32)
    norms = []

    from callbacks import Callback

    class Norm(Callback):
        def on_optimizer_step_end(self, trainer):
            norms.append(float(trainer.state.grad_norm))

    model = make_mlp(seed=4)
    before = params_of(model)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=32, max_steps=1,
                             max_grad_norm=1e-3, report_to=[], save_strategy="no")
    Trainer(model, args, train_dataset=data, loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[Norm()],
            optimizer=paddle.optimizer.SGD(learning_rate=1.0, parameters=model.parameters())).fit()
    after = params_of(model)
    step = np.sqrt(sum(((after[k] - before[k]) ** 2).sum() for k in before))
    assert norms[0] > 1e-3  # the raw gradient was larger than the bound
    assert step == pytest.approx(1e-3, rel=1e-3)  # lr 1.0 x clipped gradient of norm 1e-3


def test_max_steps_overrides_epochs_and_epochs_reshuffle(tmp_path):
    data = ToyDataset(40)
    orders = []

    from callbacks import Callback

    class FirstBatch(Callback):
        def on_epoch_begin(self, trainer):
            orders.append(list(trainer._train_sampler)[0])

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, num_train_epochs=100,
                             max_steps=12, report_to=[], save_strategy="no")
    state = Trainer(make_mlp(), args, train_dataset=data, loss_fn=paddle.nn.CrossEntropyLoss(),
                    callbacks=[FirstBatch()]).fit()
    assert state.global_step == 12 and state.epoch == 2 and state.step_in_epoch == 2
    assert len(orders) == 3 and orders[0] != orders[1]


def test_default_optimizer_is_adamw_without_decay_on_biases(tmp_path):
    model = make_mlp()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, weight_decay=0.1, report_to=[], save_strategy="no")
    trainer = Trainer(model, args, train_dataset=ToyDataset(16), loss_fn=paddle.nn.CrossEntropyLoss())
    trainer.fit()
    opt = trainer.optimizer
    assert isinstance(opt, paddle.optimizer.AdamW)
    decayed = {name for name, p in model.named_parameters() if opt._apply_decay_param_fun(p.name)}
    assert decayed == {"0.weight", "2.weight"}


def test_dict_batches_with_model_returning_loss(tmp_path):
    class DictData(paddle.io.Dataset):
        def __init__(self):
            self.base = ToyDataset(32)

        def __len__(self):
            return len(self.base)

        def __getitem__(self, i):
            x, y = self.base[i]
            return {"features": x, "labels": y}

    class WithLoss(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.net = make_mlp()

        def forward(self, features, labels=None):
            logits = self.net(features)
            return (paddle.nn.functional.cross_entropy(logits, labels), logits)

    model = WithLoss()
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, num_train_epochs=5,
                             learning_rate=0.05, logging_steps=4, report_to=[], save_strategy="no")
    trainer = Trainer(model, args, train_dataset=DictData(), eval_dataset=DictData())
    state = trainer.fit()
    losses = [r["loss"] for r in state.log_history if "loss" in r]
    assert losses[-1] < losses[0]
    assert "eval_loss" in trainer.evaluate()
