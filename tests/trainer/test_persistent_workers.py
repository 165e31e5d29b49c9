"""Persistent DataLoader workers (``dataloader_persistent_workers``): one set for every epoch and one for
every evaluation of a fit(), ended however fit() ends (completed, stopped, failed, SIGTERM, kill -9 of the
trainer), the samples' randomness and the resume unchanged. Real processes and signals: the run is a
subprocess (tests/distributed/workers/persistent_toy.py)."""

import collections
import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import REPO, gone_within, kill_trees, wait_for

TOY = os.path.join(REPO, "tests", "distributed", "workers", "persistent_toy.py")
ENV = dict(os.environ, PYTHONPATH=REPO, PTRAIN_PREEMPT_STALL_SECONDS="3")
_STARTED = []


@pytest.fixture(autouse=True)
def _no_leftovers():
    yield
    kill_trees(_STARTED)


def start(out, mode, persistent=1):
    proc = subprocess.Popen([sys.executable, TOY, str(out), mode, str(persistent)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _STARTED.append(proc)
    return proc


def run(out, mode, persistent=1):
    os.makedirs(out, exist_ok=True)
    proc = start(out, mode, persistent)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.load(open(os.path.join(out, "result.json")))


def draws(out):
    """{worker pid: [(index, draw)]} as the workers fetched them."""
    found = {}
    for path in glob.glob(os.path.join(out, "draws-*.txt")):
        pid = int(os.path.basename(path)[6:-4])
        found[pid] = [(int(i), float(d)) for i, d in (line.split() for line in open(path))]
    return found


def all_gone(pids):
    return gone_within(pids, 15) == []


def test_one_set_of_workers_for_every_epoch_and_evaluation_same_training(tmp_path):
    kept = run(tmp_path / "kept", "completed", 1)
    fresh = run(tmp_path / "fresh", "completed", 0)
    assert kept["status"] == fresh["status"] == "completed"
    # 3 epochs, an evaluation after each: the 2 training workers fetched every epoch's samples
    kept_draws, fresh_draws = draws(tmp_path / "kept"), draws(tmp_path / "fresh")
    assert len(kept_draws) == 2 and sum(map(len, kept_draws.values())) == 3 * 32
    assert len(fresh_draws) == 6  # without: 2 new workers an epoch
    evals = [set(pids) for what, _, pids in kept["seen"] if what == "eval"]
    assert len(evals) == 3 and len(evals[0]) == 4 and all(e == evals[0] for e in evals), kept["seen"]
    assert set(kept_draws) < evals[0]  # the same 2 training and 2 evaluation workers, all run long
    assert kept["after"] == [] and fresh["after"] == []  # fit() ended them
    # each sample's noise is seeded from (seed, epoch, index): a worker forked in epoch 0 draws epoch 2's
    per_index = _per_index(kept_draws)
    assert len(per_index) == 32 and all(len(set(v)) == 3 for v in per_index.values())  # a new draw every epoch
    assert per_index == _per_index(fresh_draws)
    for name, value in kept["params"].items():
        np.testing.assert_array_equal(np.array(value), np.array(fresh["params"][name]), err_msg=name)


def _per_index(found):
    per_index = collections.defaultdict(list)
    for rows in found.values():
        for i, d in rows:
            per_index[i].append(d)
    return {i: sorted(v) for i, v in per_index.items()}


def test_stopped_failed_and_resumed_runs_end_their_workers(tmp_path):
    stopped = run(tmp_path / "stopped", "stopped")
    assert stopped["status"] == "stopped" and stopped["step"] == 10 and stopped["after"] == []
    assert stopped["seen"] and len(stopped["seen"][-1][2]) == 4  # workers were alive (epoch 1 after its evaluation)
    failed = run(tmp_path / "failed", "failed")
    assert "failed on purpose at step 10" in failed["error"] and failed["after"] == []
    resumed = run(tmp_path / "resumed", "resume")
    assert resumed["status"] == "completed" and resumed["after"] == []
    straight = run(tmp_path / "straight", "completed")
    for name, value in straight["params"].items():  # the resume through persistent workers is exact
        np.testing.assert_array_equal(np.array(value), np.array(resumed["params"][name]), err_msg=name)


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_signalled_or_killed_trainer_leaves_no_worker(tmp_path, how):
    proc = start(tmp_path, "hold")
    wait_for(os.path.join(tmp_path, "ready"), proc, timeout=300)
    pids = json.load(open(os.path.join(tmp_path, "pids.json")))
    assert len(pids) == 5, pids  # the trainer, its 2 training and 2 evaluation workers
    if how == "sigterm":
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 143, err[-3000:]
        assert time.time() - t0 < 60
    else:
        proc.kill()
        proc.communicate(timeout=60)
    assert all_gone(pids[1:])
