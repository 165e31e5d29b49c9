"""Resume refuses every changed setting that would make the resumed run differ from the interrupted one
(trainer.checkpoint.resume), allows the ones listed as free, says which checkpoint it picked and why, and logs
the same loss for the window that spans the interruption."""

import logging
import os
import re
import shutil

import paddle
import pytest
from helpers import REPO, ToyDataset, make_mlp

from trainer import ConfigError, Trainer, TrainingArguments

BASE = dict(per_device_train_batch_size=8, max_steps=12, learning_rate=0.01, warmup_steps=2, lr_scheduler_type="cosine",
            save_steps=5, logging_steps=4, report_to=[], evaluation_strategy="no", save_async=False)


def make(out, n=60, **changes):
    args = TrainingArguments(output_dir=str(out), **{**BASE, **changes})
    return Trainer(make_mlp(), args, train_dataset=ToyDataset(n), loss_fn=paddle.nn.CrossEntropyLoss())


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    t = make(out)
    t.fit()
    return out, t


@pytest.fixture
def ckpt(full, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(full[0], out)
    return out, str(out / "checkpoints" / "step-5")


@pytest.mark.parametrize("changes, pattern", [
    (dict(per_device_train_batch_size=4), r"resume: per_device_train_batch_size was 8 in checkpoint .*step-5, this run "
                                          r"has 4: the global batch would be 4, not 8, .*replayed or skipped; resume with "
                                          r"per_device_train_batch_size=8, or keep the global batch with "
                                          r"gradient_accumulation_steps=2, or start a fresh run"),
    (dict(gradient_accumulation_steps=2), r"resume: gradient_accumulation_steps was 1 in .*, this run has 2: the global "
                                          r"batch would be 16, not 8"),
    (dict(seed=7), r"resume: seed was 42 in checkpoint .*, this run has 7: it would change what is trained; resume "
                   r"with seed=42"),
    (dict(data_seed=3), r"resume: data_seed was 0 in .*, this run has 3"),
    (dict(optim="sgd"), r"resume: optim was 'adamw' in .*, this run has 'sgd'"),
    (dict(lr_scheduler_type="linear"), r"resume: lr_scheduler_type was 'cosine' in .*, this run has 'linear'"),
    (dict(learning_rate=0.02), r"resume: learning_rate was 0.01 in .*, this run has 0.02"),
    (dict(warmup_steps=3), r"resume: warmup_steps was 2 in .*, this run has 3"),
    (dict(max_steps=3), r"resume: max_steps=3 is below step 5 of checkpoint .*: give max_steps above 5"),
    (dict(max_steps=-1, num_train_epochs=0.5), r"resume: num_train_epochs=0.5 \(4 steps\) is below step 5"),
])
def test_changed_setting_is_refused_in_one_line(ckpt, changes, pattern):
    out, path = ckpt
    t = make(out, **changes)
    before = sorted(os.listdir(out / "checkpoints"))
    with pytest.raises(ConfigError, match=pattern) as err:
        t.fit(resume_from_checkpoint=path)
    assert "\n" not in str(err.value) and err.value.exit_code == 2
    assert sorted(os.listdir(out / "checkpoints")) == before  # nothing trained, nothing saved
    assert t.state.global_step == 0


def test_grown_dataset_is_refused(ckpt):
    out, path = ckpt
    with pytest.raises(ConfigError, match=r"resume: the training dataset has 70 samples, the run in checkpoint .* had 60"):
        make(out, n=70).fit(resume_from_checkpoint=path)


def test_allowed_changes_resume_and_finish(ckpt, full):
    out, path = ckpt
    t = make(out, logging_steps=2, save_steps=3, save_total_limit=2, per_device_eval_batch_size=3, save_async=True)
    state = t.fit(resume_from_checkpoint=path)
    assert state.status == "completed" and state.global_step == 12
    for k, v in full[1].model.state_dict().items():
        assert (t.model.state_dict()[k].numpy() == v.numpy()).all(), k


def test_same_global_batch_split_differently_is_allowed(ckpt):
    out, path = ckpt
    state = make(out, per_device_train_batch_size=4, gradient_accumulation_steps=2).fit(resume_from_checkpoint=path)
    assert state.global_step == 12 and state.global_batch_size == 8


def test_larger_max_steps_is_allowed_and_says_the_schedule_is_replanned(ckpt, caplog):
    out, path = ckpt
    with caplog.at_level(logging.WARNING, logger="trainer.resume"):
        state = make(out, max_steps=15).fit(resume_from_checkpoint=path)
    assert state.global_step == 15
    assert "this run trains to step 15, the checkpoint's run to step 12" in caplog.text


def test_max_steps_equal_to_the_checkpoint_step_completes_at_once(ckpt):
    out, path = ckpt
    state = make(out, max_steps=5).fit(resume_from_checkpoint=path)
    assert state.status == "completed" and state.global_step == 5


def test_free_fields_are_fields_and_the_docs_list_them():
    from trainer.checkpoint.resume import BATCH_FIELDS, LENGTH_FIELDS, MAY_CHANGE

    names = set(TrainingArguments.field_names())
    assert MAY_CHANGE <= names and set(LENGTH_FIELDS) <= names and set(BATCH_FIELDS) <= names
    with open(os.path.join(REPO, "docs", "how-to", "resume.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("<!-- may-change -->")[1].split("<!-- /may-change -->")[0]
    assert set(re.findall(r"`(\w+)`", section)) == set(MAY_CHANGE)


def test_auto_says_which_checkpoint_it_picked_and_why(ckpt, caplog):
    out, _ = ckpt
    with caplog.at_level(logging.INFO, logger="trainer.checkpoint"):
        make(out, max_steps=13).fit(resume_from_checkpoint="auto")
    assert re.search(r"resume auto: resuming from .*step-12 \(the newest checkpoint whose files verify, named by "
                     r"checkpoints/latest\)", caplog.text), caplog.text
    # damage the newest: auto takes the next and names the one it skipped and why
    with open(out / "checkpoints" / "step-13" / "model.safetensors", "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x00\x01\x02\x03")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trainer.checkpoint"):
        make(out, max_steps=13).fit(resume_from_checkpoint="auto")
    assert re.search(r"resume auto: resuming from .*step-12 \(the newest checkpoint whose files verify\); skipped 1 "
                     r"newer: step-13 \(checkpoint file .*model.safetensors is missing or does not match its manifest",
                     caplog.text), caplog.text


def test_loss_of_the_window_spanning_the_interruption_equals_the_uninterrupted_run(ckpt, full):
    out, path = ckpt  # step 5 is inside the logging window 5..8
    t = make(out)
    t.fit(resume_from_checkpoint=path)
    expected = {r["step"]: r["loss"] for r in full[1].state.log_history if "loss" in r}
    got = {r["step"]: r["loss"] for r in t.state.log_history if "loss" in r}
    assert sorted(got) == [4, 8, 12]  # step 4 comes from the checkpoint's log history
    assert got[8] == expected[8] and got[12] == expected[12]


def test_uneven_epoch_across_world_sizes_is_said(caplog):
    from trainer.checkpoint.resume import _warn_uneven_epoch

    meta = {"world_size": 2, "state": {"epoch": 1, "step_in_epoch": 3}}
    with caplog.at_level(logging.WARNING, logger="trainer.resume"):
        _warn_uneven_epoch(meta, 96, 1)
        assert caplog.text == ""
        _warn_uneven_epoch(meta, 97, 1)
    assert "97 samples do not divide by both 2 and 1 processes" in caplog.text and "rest of epoch 1" in caplog.text


def test_an_explicit_checkpoint_is_named_once(ckpt, caplog):
    out, path = ckpt
    with caplog.at_level(logging.INFO):
        make(out).fit(resume_from_checkpoint=path)
    lines = [r.getMessage() for r in caplog.records if "resum" in r.getMessage()]
    assert lines == [f"resuming from {path} (given explicitly; its files verify)"], lines


def test_a_task_option_newer_than_the_checkpoint_does_not_block_its_resume():
    from trainer.checkpoint.resume import check_identity
    from trainer.errors import ConfigError

    saved = {"identity": {"source": "task resnet50", "fields": {"image_size": 224}}}
    now = {"source": "task resnet50", "fields": {"image_size": 224, "max_image_pixels": 89478485}}
    check_identity(now, saved, "ckpt")  # the checkpoint was written before max_image_pixels existed
    with pytest.raises(ConfigError, match="image_size"):  # a recorded option that changed is still refused
        check_identity({**now, "fields": {**now["fields"], "image_size": 160}}, saved, "ckpt")
