"""The pieces of auto_find_batch_size, eval_accumulation_steps and skip_memory_metrics that need no memory
limit (tests/distributed/test_auto_batch.py runs the retry under a real RLIMIT_AS)."""

import numpy as np
import paddle
from helpers import ToyDataset, make_mlp, params_of

from trainer import Trainer, TrainingArguments
from trainer.auto_batch import split_batch
from trainer.evaluation import _HostParts


def args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), report_to=[], save_strategy="no", evaluation_strategy="no",
                overwrite_output_dir=True)
    return TrainingArguments(**{**base, **kw})


def test_split_batch_cuts_tensors_dicts_and_per_sample_lists_and_weights_by_share():
    batch = {"input_ids": paddle.arange(10).reshape([5, 2]), "labels": np.arange(5), "texts": list("abcde"), "k": 3}
    pieces = split_batch(batch, 2)
    assert [share for _, share in pieces] == [0.4, 0.4, 0.2]
    assert [p["texts"] for p, _ in pieces] == [["a", "b"], ["c", "d"], ["e"]]
    assert pieces[2][0]["input_ids"].numpy().tolist() == [[8, 9]] and pieces[1][0]["labels"].tolist() == [2, 3]
    assert all(p["k"] == 3 for p, _ in pieces)
    assert split_batch(batch, 5) == [(batch, 1.0)] and split_batch(batch, 0) == [(batch, 1.0)]


def test_a_cut_batch_trains_the_same_model(tmp_path):
    def run(micro):
        model = make_mlp()
        trainer = Trainer(model, args(tmp_path, max_steps=6, per_device_train_batch_size=16, gradient_accumulation_steps=2,
                                      auto_find_batch_size=True, optim="sgd", learning_rate=0.5),
                          train_dataset=ToyDataset(96), loss_fn=paddle.nn.CrossEntropyLoss())
        trainer.state.train_micro_batch_size = micro  # as a resume from a checkpoint of a run that shrank
        trainer.fit()
        return params_of(model), trainer.state

    whole, state_whole = run(0)
    cut, state_cut = run(5)  # 16 = 5 + 5 + 5 + 1: unequal pieces weigh by their share
    assert max(float(np.abs(whole[k] - cut[k]).max()) for k in whole) <= 1e-6
    assert state_cut.samples_seen == state_whole.samples_seen and state_cut.global_batch_size == 32
    assert state_cut.state_dict()["train_micro_batch_size"] == 5  # saved with the state in every checkpoint


def test_per_device_train_batch_size_auto_turns_the_search_on():
    a = TrainingArguments.from_yaml_and_cli(None, ["--per_device_train_batch_size", "auto"])
    assert a.auto_find_batch_size is True and a.per_device_train_batch_size == 8


def test_memory_metrics_are_logged_only_when_asked(tmp_path):
    for skip in (True, False):
        trainer = Trainer(make_mlp(), args(tmp_path, max_steps=4, logging_steps=2, skip_memory_metrics=skip),
                          train_dataset=ToyDataset(64), loss_fn=paddle.nn.CrossEntropyLoss())
        trainer.fit()
        logged = [r for r in trainer.state.log_history if "loss" in r]
        assert len(logged) == 2
        assert all(("peak_host_rss_mb" in r) is (not skip) for r in logged)
        if not skip:
            assert all(r["peak_host_rss_mb"] > 50 for r in logged)  # paddle alone holds more than that


def test_eval_accumulation_moves_outputs_to_the_host_every_n_batches_and_changes_no_result(tmp_path):
    parts = _HostParts(3)
    batch = [paddle.ones([2, 4])]
    kept, _ = parts.maybe_move(batch * 2, [])
    assert len(kept) == 2 and not parts.parts
    kept, _ = parts.maybe_move(batch * 3, [])
    assert kept == [] and isinstance(parts.parts[0][0], np.ndarray) and parts.parts[0][0].shape == (6, 4)

    outputs = []
    for every in (None, 3):
        trainer = Trainer(make_mlp(), args(tmp_path, per_device_eval_batch_size=7, eval_accumulation_steps=every),
                          loss_fn=paddle.nn.CrossEntropyLoss())
        outputs.append(trainer.predict(ToyDataset(50)))
    assert np.array_equal(outputs[0].predictions, outputs[1].predictions)
    assert np.array_equal(outputs[0].label_ids, outputs[1].label_ids)
    assert outputs[0].metrics["test_loss"] == outputs[1].metrics["test_loss"]


def test_cut_micro_batches_cost_no_host_sync_per_step(tmp_path):
    from host_syncs import CountSyncs

    counter = CountSyncs()
    trainer = Trainer(make_mlp(), args(tmp_path, max_steps=8, logging_steps=4, per_device_train_batch_size=16,
                                       gradient_accumulation_steps=2, auto_find_batch_size=True),
                      train_dataset=ToyDataset(96), loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[counter])
    trainer.state.train_micro_batch_size = 5
    with counter.installed():
        trainer.fit()
    assert len(counter.per_step) == 6 and set(counter.per_step) == {0}, counter.sources
