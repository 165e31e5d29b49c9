"""A map-style training set whose length changes between epochs (issue 40 item 11). The run keeps the length
it was planned with (steps per epoch, max_steps, the LR schedule and resume positions come from it, and every
rank draws the same order from it): a dataset that grew is named in one warning and the run goes on over the
planned samples; one that shrank stops with a DataError at the start of the epoch, before a missing sample is
asked for. Real training, on 1 process and under a 2-process launch."""

import json
import logging
import os
import sys

import pytest
from helpers import REPO, free_port, launch, run_launch

from trainer import DataError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers"))
from length_toy import train

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "length_toy.py")


def test_a_grown_dataset_is_named_once_and_the_run_keeps_its_planned_samples(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trainer"):
        data, trainer = train(str(tmp_path), 56)
    assert trainer.state.status == "completed" and trainer.state.global_step == 15  # 3 epochs x 40 / 8
    assert sorted(data.asked) == sorted(list(range(40)) * 3)  # every planned sample once per epoch, nothing beyond
    said = [r.getMessage() for r in caplog.records if "samples at the start of epoch" in r.getMessage()]
    assert said == [("the training dataset has 56 samples at the start of epoch 1, 40 when this run was planned: the "
                    "run goes on over the first 40 (samples 40-55 are not read: the steps per epoch, the learning-rate "
                    "schedule and resume positions are computed from 40, and every rank must draw the same order); "
                    "to train on all 56, start a fresh run over them")]  # once, not again at epoch 2


def test_a_shrunk_dataset_stops_at_the_epoch_start_before_a_missing_sample_is_asked_for(tmp_path):
    with pytest.raises(DataError, match=r"^the training dataset has 30 samples at the start of epoch 1, 40 when this "
                                        r"run was planned: samples 30-39 of its epochs are gone"):
        train(str(tmp_path), 30)
    with open(tmp_path / "rank0.json") as f:
        rank0 = json.load(f)
    assert rank0["steps"] == 5 and rank0["status"] == "failed"  # the first epoch, whole
    assert sorted(rank0["asked"]) == list(range(40))  # nothing of epoch 1 was read


@pytest.mark.timeout(600)
def test_on_two_processes_a_grown_dataset_keeps_both_ranks_on_the_planned_order(tmp_path):
    proc = launch(WORKER, [tmp_path, 56], nproc=2, log_dir=str(tmp_path / "logs"))
    ranks = []
    for r in (0, 1):
        with open(tmp_path / f"rank{r}.json") as f:
            ranks.append(json.load(f))
    assert [r["steps"] for r in ranks] == [9, 9]  # 3 epochs of ceil(40 / 2 / 8) = 3 steps, on both ranks
    # together the ranks read each of the 40 planned samples once per epoch (40 divides by 2: no padding)
    assert sorted(ranks[0]["asked"] + ranks[1]["asked"]) == sorted(list(range(40)) * 3)
    with open(tmp_path / "logs" / "workerlog.0") as f:
        assert "56 samples at the start of epoch 1, 40 when this run was planned" in f.read()
    del proc


@pytest.mark.timeout(600)
def test_on_two_processes_a_shrunk_dataset_stops_both_ranks_at_the_epoch_start(tmp_path):
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--master",
           f"127.0.0.1:{free_port()}", "--log_dir", str(tmp_path / "logs"), WORKER, str(tmp_path), "30"]
    proc = run_launch(cmd, str(tmp_path / "logs"), dict(os.environ, PYTHONPATH=REPO), timeout=300)
    assert proc.returncode != 0
    with open(tmp_path / "rank0.json") as f:
        rank0 = json.load(f)
    assert rank0["steps"] == 3 and rank0["status"] == "failed"  # the first epoch, whole
    assert sorted(rank0["asked"]) == sorted(set(rank0["asked"])) and len(rank0["asked"]) == 20  # epoch 0 only
    with open(tmp_path / "logs" / "workerlog.0") as f:
        assert "DataError: the training dataset has 30 samples at the start of epoch 1, 40 when this run was " \
               "planned" in f.read()
    if os.path.exists(tmp_path / "rank1.json"):  # rank 1 stops the same way, unless the launcher ended it first
        with open(tmp_path / "rank1.json") as f:
            rank1 = json.load(f)
        assert rank1["steps"] == 3 and len(rank1["asked"]) == 20
        assert sorted(rank0["asked"] + rank1["asked"]) == list(range(40))  # epoch 0 whole, nothing of epoch 1
