"""The objects alive when the training loop starts are frozen out of the full collections for the loop
(trainer.heap.frozen_heap), unfrozen after it, and a program's own gc.freeze() is left alone."""

import gc
import json
import os
import subprocess
import sys

import paddle
import pytest
from helpers import REPO, ToyDataset, make_mlp

from callbacks import Callback
from trainer import Trainer, TrainingArguments


class FreezeCount(Callback):
    def __init__(self):
        self.counts = []

    def on_step_end(self, trainer):
        self.counts.append(gc.get_freeze_count())


def fit(tmp_path):
    seen = FreezeCount()
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=3, report_to=[],
                             save_strategy="no")
    Trainer(make_mlp(), args, train_dataset=ToyDataset(), loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[seen]).fit()
    return seen.counts


def test_the_loop_runs_with_the_heap_frozen_and_leaves_it_as_it_was(tmp_path):
    assert gc.get_freeze_count() == 0
    counts = fit(tmp_path / "a")
    assert len(counts) == 3 and min(counts) > 10_000  # paddle, the model, the data: frozen during the steps
    assert gc.get_freeze_count() == 0


def test_a_program_that_froze_its_own_objects_keeps_them_frozen(tmp_path):
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        counts = fit(tmp_path / "b")
        # not frozen again (that would add the objects made since: the model, the data, the loop's) and not
        # unfrozen; a frozen object can still be freed by its reference count, so the count only falls
        assert max(counts) <= mine and mine - 1_000 < gc.get_freeze_count() <= mine
    finally:
        gc.unfreeze()


WAITERS = """
import json, sys, threading, time
from trainer import heap

def vm_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmSize")) / 1024

stop = threading.Event()
before = vm_mib()
threads = [heap.start_waiting_thread(threading.Thread(target=lambda: [stop.wait(0.01) for _ in range(50)],
                                                      daemon=True)) for _ in range(3)]
time.sleep(0.3)
grew = vm_mib() - before
stop.set()
print(json.dumps({"grew_mib": grew, "cap": heap.share_arenas(), "arenas": heap.malloc_arenas()}))
"""


def _waiters(env_extra):
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    env.update(PYTHONPATH=REPO, **env_extra)
    proc = subprocess.run([sys.executable, "-c", WAITERS], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's arenas, /proc")
def test_waiting_threads_cost_next_to_no_address_space():
    """Three waiting threads: a 512 KiB stack each and no arena of their own (64 MiB of address space each
    before issue 41, 216 MiB in all); an environment that set MALLOC_ARENA_MAX keeps its choice."""
    shared = _waiters({})
    assert shared["cap"] >= 1 and shared["arenas"] == shared["cap"] and shared["grew_mib"] < 16, shared
    chosen = _waiters({"MALLOC_ARENA_MAX": "8"})
    assert chosen["cap"] == 0 and chosen["grew_mib"] > 3 * 64, chosen
