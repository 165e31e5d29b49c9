"""A DataLoader worker killed while the step runs (not while a batch is fetched): paddle's SIGCHLD
handler raises its SystemError wherever the main thread is, and fit() still names it WorkerKilled."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import paddle
import psutil
import pytest
from patience import patience

from callbacks import Callback
from trainer import Trainer, TrainingArguments
from trainer.errors import WorkerKilled


class Pairs(paddle.io.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return np.full([4], i % 7, dtype="float32"), np.int64(i % 2)


class KillAWorkerThenWork(Callback):
    """At step 3: SIGKILL one loader worker, then keep the main thread busy in Python (as a callback,
    the optimizer or an import would) until paddle's SIGCHLD handler raises inside this callback."""

    def __init__(self):
        self.raised_here = False

    def on_step_end(self, trainer):
        if trainer.state.global_step != 3:
            return
        me = psutil.Process()
        workers = [p for p in me.children() if p.status() != psutil.STATUS_ZOMBIE]
        assert workers, "no DataLoader worker to kill"
        os.kill(workers[0].pid, signal.SIGKILL)
        deadline = time.monotonic() + patience(30)
        try:
            while time.monotonic() < deadline:
                sum(range(1000))  # bytecodes: where a Python signal handler runs
        except SystemError:
            self.raised_here = True
            raise
        raise AssertionError("paddle's SIGCHLD handler never raised")


def test_a_worker_killed_during_the_step_is_worker_killed_with_its_signal(tmp_path):
    model = paddle.nn.Linear(4, 2)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=20,
                             dataloader_num_workers=2, report_to=[], save_strategy="no", evaluation_strategy="no")
    spy = KillAWorkerThenWork()
    trainer = Trainer(model, args, train_dataset=Pairs(), loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[spy])
    with pytest.raises(WorkerKilled, match=r"DataLoader worker \(pid \d+\) was killed by SIGKILL") as info:
        trainer.fit()
    assert spy.raised_here  # the error came from inside the callback, not from the batch fetch
    assert info.value.signum == signal.SIGKILL and trainer.state.status == "failed"
    deadline = time.monotonic() + patience(10)  # and no worker is left behind
    while [p for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE]



class StartCutBySignal:
    """A loader whose iterator start is cut after its workers forked, as paddle's SIGCHLD handler cuts it when a
    worker of the previous iterator died meanwhile (the handler raises wherever the main thread is)."""

    def __init__(self):
        self.workers = []

    def __iter__(self):
        self.started = iter(paddle.io.DataLoader(Pairs(), batch_size=8, num_workers=2))
        self.workers = list(self.started._workers)
        _signal_inside(self.started)


def _signal_inside(self):
    """paddle's handler raising in a frame of the iterator's own start (``self`` is the iterator there)."""
    raise SystemError("(Fatal) DataLoader process (pid 1) exited is killed by signal: Killed.")


def test_workers_of_an_iterator_whose_start_was_cut_are_ended_so_the_process_can_exit():
    """Those workers belong to no iterator; paddle's workers ignore the SIGTERM that multiprocessing's exit
    handler sends before it joins them, so the process hung at exit (seen under load: a WorkerKilled run printed
    its error and never ended). The trainer's iter() shuts the cut iterator down and SIGKILLs the workers it had forked."""
    from trainer.data.loader import epoch_iterator

    loader = StartCutBySignal()
    with pytest.raises(SystemError, match="killed by signal"):
        epoch_iterator(loader)
    assert len(loader.workers) == 2 and not any(w.is_alive() for w in loader.workers)
    assert loader.started._shutdown  # its __del__ at interpreter exit has nothing left to wait for
