"""Process lifetime in one training process: DataLoader workers per epoch, kill -9, a blocked
``__getitem__`` and SIGTERM. Real processes, real signals (the run is a subprocess)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import REPO, gone_within, kill_trees, wait_for
from patience import patience

from trainer.checkpoint.manifest import verify

TOY = os.path.join(REPO, "tests", "distributed", "workers", "lifetime_toy.py")
ENV = dict(os.environ, PYTHONPATH=REPO, PTRAIN_PREEMPT_STALL_SECONDS="3")


_STARTED = []


@pytest.fixture(autouse=True)
def _no_leftovers():
    yield
    kill_trees(_STARTED)


def start(out, mode, workers):
    proc = subprocess.Popen([sys.executable, TOY, out, mode, str(workers)], env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    _STARTED.append(proc)
    return proc


def test_dataloader_workers_stay_constant_over_epochs(tmp_path):
    """40 epochs with 2 workers: never more than the 2 workers of the running epoch; fds level off."""
    out = str(tmp_path)
    proc = start(out, "epochs", 2)
    _, err = proc.communicate(timeout=patience(300))
    assert proc.returncode == 0, err[-3000:]
    rows = json.load(open(os.path.join(out, "epochs.json")))
    assert len(rows) == 40
    assert max(r["children"] for r in rows) <= 2, rows
    # each stopped iterator frees its pipes when paddle's reader thread notices (within its 5 s poll):
    # the count levels off instead of growing with every epoch (before: ~10 more per epoch)
    fds = [r["fds"] for r in rows]
    assert max(fds[20:]) <= max(fds[:20]) + 12, fds


def test_kill9_of_the_trainer_leaves_no_dataloader_worker(tmp_path):
    out = str(tmp_path)
    proc = start(out, "block", 2)
    wait_for(os.path.join(out, "at-10-rank0"), proc)
    pids = json.load(open(os.path.join(out, "pids-rank0.json")))
    assert len(pids) >= 3  # the trainer and its 2 workers
    proc.kill()
    proc.communicate(timeout=patience(30))
    assert gone_within(pids[1:], 15) == []


@pytest.mark.parametrize("workers", [0, 2])
def test_sigterm_with_a_blocked_getitem_saves_the_last_step(tmp_path, workers):
    """``__getitem__`` blocks for good; the stall is reported; SIGTERM ends the run in seconds with 143
    and the last finished step saved (verified)."""
    out = str(tmp_path)
    proc = start(out, "block", workers)
    wait_for(os.path.join(out, "at-10-rank0"), proc)
    pids = json.load(open(os.path.join(out, "pids-rank0.json")))
    open(os.path.join(out, "block"), "w").close()
    wait_for(os.path.join(out, "stall-rank0.txt"), proc, timeout=patience(60))  # reported while it lasts
    last = int(open(os.path.join(out, "last-rank0")).read())
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=patience(120))
    elapsed = time.time() - t0
    assert proc.returncode == 143, err[-3000:]
    assert elapsed < 30, err[-3000:]
    assert "waiting for data" in err
    latest = open(os.path.join(out, "checkpoints", "latest")).read().strip()
    assert latest == f"step-{last}", err[-3000:]
    verify(os.path.join(out, "checkpoints", latest))
    assert gone_within(pids, 15) == []


def test_die_with_parent_covers_a_parent_already_gone():
    """The race: the parent died before prctl (this process was re-parented): the signal comes at once."""
    code = ("import signal, time; from trainer.process import die_with_parent; "
            "assert die_with_parent(signal.SIGTERM, parent_pid=-7); time.sleep(60)")
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", code], env=ENV, timeout=patience(60), capture_output=True, text=True)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
    assert time.time() - t0 < 30
