"""Worker for the StallWatchdog tests that need their own process(es).

usage: watchdog_toy.py OUT_DIR slow|stall|stop|gil

Under ``paddle.distributed.launch`` with 2 processes (the watchdog is on by default there):

slow:  rank 1's samples take 20 ms each (80 ms per batch); rank 0 must name rank 1.
stall: rank 1's 14th sample takes 60 s; every rank's watchdog (timeout 2 s, action 'stop')
       reports and ends its process with exit code 124.

As a single process (the watchdog added explicitly, timeout 0.5 s, action 'stop'):

stop:  the 14th sample takes 60 s in time.sleep: the watchdog thread exits with 124.
gil:   the 14th sample takes 60 s in a C call that holds the GIL: the watchdog thread
       cannot run, faulthandler's backstop dumps the stacks and exits with 1.
"""

import ctypes
import json
import os
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))  # the repository first: trainer is the package, not tests/trainer
sys.path.append(TESTS)

import paddle  # noqa: E402
from helpers import ToyDataset, make_mlp  # noqa: E402

from callbacks import StallWatchdog  # noqa: E402
from trainer import Trainer, TrainingArguments  # noqa: E402
from trainer import distributed as dist  # noqa: E402


class PacedDataset(ToyDataset):
    """ToyDataset whose samples take ``delay`` seconds each; the ``stall_at``-th fetch takes ``stall`` seconds
    (``hold_gil``: inside a C call that keeps the GIL, like a C extension that never releases it)."""

    def __init__(self, n, delay=0.0, stall_at=None, stall=0.0, hold_gil=False):
        super().__init__(n)
        self.delay, self.stall_at, self.stall, self.hold_gil = delay, stall_at, stall, hold_gil
        self.fetched = 0

    def __getitem__(self, i):
        self.fetched += 1
        if self.fetched == self.stall_at:
            if self.hold_gil:
                ctypes.PyDLL(None).sleep(int(self.stall))  # PyDLL: the GIL stays held during the call
            else:
                time.sleep(self.stall)
        elif self.delay:
            time.sleep(self.delay)
        return super().__getitem__(i)


def main(out_dir, mode):
    rank = dist.get_rank()
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=4, max_steps=13, logging_steps=4,
                             learning_rate=0.01, optim="sgd", report_to=[], save_strategy="no")
    if mode == "slow":
        data = PacedDataset(128, delay=0.02 if rank == 1 else 0.0)
    elif mode == "stall":  # the second sample of rank 1's 4th batch
        data = PacedDataset(128, stall_at=14 if rank == 1 else None, stall=60.0)
    else:
        data = PacedDataset(128, stall_at=14, stall=60.0, hold_gil=mode == "gil")
    extra = [StallWatchdog(timeout=0.5, action="stop")] if mode in ("stop", "gil") else []
    trainer = Trainer(make_mlp(seed=1), args, train_dataset=data, loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=extra)
    watchdog = trainer.callbacks.get(StallWatchdog)  # under the launcher: the default one
    if mode == "stall":
        watchdog.timeout, watchdog.action = 2.0, "stop"
    state = trainer.fit()
    with open(os.path.join(out_dir, f"watchdog-rank{rank}.json"), "w") as f:
        json.dump({"global_step": state.global_step, "slow_reports": watchdog.slow_reports,
                   "stalls": watchdog.stalls}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
