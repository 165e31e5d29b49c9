"""kill -9 at random moments (during steps and during saves), then resume with 'auto'.

Each trial must leave only complete checkpoints in place, ``latest`` naming a
complete one, and resume to the very parameters of the uninterrupted run.
``PTRAIN_KILL_TRIALS`` sets the number of trials (default 5; the long trial: 50 or more).
"""

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import REPO
from patience import patience

from trainer.checkpoint.manifest import LATEST, verify
from trainer.checkpoint.store import list_checkpoints

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "kill_toy.py")
ENV = dict(os.environ, PYTHONPATH=REPO)
TRIALS = int(os.environ.get("PTRAIN_KILL_TRIALS", "5"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ref"))
    start = time.time()
    subprocess.run([sys.executable, WORKER, out], check=True, env=ENV, capture_output=True)
    return dict(np.load(os.path.join(out, "final.npz"))), time.time() - start


def _until_saved(pointer, proc, timeout=120):
    """Until the worker's first save moved ``latest`` (or the worker ended: it then finished and saved)."""
    deadline = time.time() + patience(timeout)
    while not os.path.exists(pointer) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)


def test_kill_minus_9_at_random_moments_then_resume_is_exact(tmp_path, reference):
    want, duration = reference
    rng = random.Random(1234)
    outcomes = {"killed_before_first_checkpoint": 0, "killed_after": 0}
    worst = 0.0
    for trial in range(TRIALS):
        out = str(tmp_path / f"t{trial}")
        os.makedirs(out)
        proc = subprocess.Popen([sys.executable, WORKER, out], env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        if trial % 2:
            # every other trial kills after the first save, wherever the load put it: a moment drawn from the
            # reference run's time alone fell before the first save in all 5 trials once the load had risen
            # after the reference run (seen in a full suite)
            _until_saved(os.path.join(out, "checkpoints", LATEST), proc)
            time.sleep(rng.uniform(0.0, max(0.3, duration * 0.5)))
        else:
            time.sleep(rng.uniform(0.3, max(0.6, duration * 0.9)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # what is in place must be complete
        for ckpt in list_checkpoints(out):
            verify(ckpt)
        pointer = os.path.join(out, "checkpoints", LATEST)
        if os.path.exists(pointer):
            verify(os.path.join(out, "checkpoints", open(pointer).read().strip()))
            outcomes["killed_after"] += 1
        else:
            outcomes["killed_before_first_checkpoint"] += 1
        if os.path.exists(os.path.join(out, "final.npz")):
            os.remove(os.path.join(out, "final.npz"))  # finished before the kill: resume must still be a no-op
        resumed = subprocess.run([sys.executable, WORKER, out, "resume"], env=ENV, capture_output=True, text=True)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        got = dict(np.load(os.path.join(out, "final.npz")))
        assert int(got["step"]) == 48
        for k in want:
            if k != "step":
                worst = max(worst, float(np.abs(got[k] - want[k]).max()))
                np.testing.assert_array_equal(got[k], want[k], err_msg=f"trial {trial}: {k}")
    print(f"\n{TRIALS} kill -9 trials: {outcomes}; worst parameter difference after resume: {worst}")
    assert outcomes["killed_after"] > 0
