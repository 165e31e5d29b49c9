"""Worker for the process-lifetime tests.

usage: lifetime_toy.py OUT_DIR MODE [NUM_WORKERS]

MODE ``syncs``: 2-process run counting device-to-host syncs per non-logging step
(Preemption on); writes syncs-rank<r>.json.
MODE ``block``: trains slowly; once OUT_DIR/block exists, ``__getitem__`` blocks
(forever); writes last-rank<r> (the last finished step) at every step, at-<step>
markers and pids-rank<r>.json (this process and its children) every 5 steps;
StallWatchdog with a 2 s timeout.
MODE ``epochs``: 40 tiny epochs with NUM_WORKERS DataLoader workers; after each
epoch records the number of child processes and open fds in epochs.json.
"""

import json
import os
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))
sys.path.append(TESTS)

import paddle  # noqa: E402
import psutil  # noqa: E402
from helpers import ToyDataset, make_mlp  # noqa: E402
from host_syncs import CountSyncs  # noqa: E402

from callbacks import Callback  # noqa: E402
from callbacks.preemption import Preemption  # noqa: E402
from callbacks.watchdog import StallWatchdog  # noqa: E402
from trainer import Trainer, TrainingArguments  # noqa: E402
from trainer import distributed as dist  # noqa: E402


class Blocking(ToyDataset):
    def __init__(self, n, flag):
        super().__init__(n)
        self.flag = flag

    def __getitem__(self, i):
        if os.path.exists(self.flag):
            time.sleep(100000)  # a dead NFS mount, a hung request
        time.sleep(0.002)
        return super().__getitem__(i)


class Mark(Callback):
    def __init__(self, out):
        self.out = out

    def _write(self, name, text):
        """Whole or not at all (a temporary file renamed): the test reads these while training goes on."""
        path = os.path.join(self.out, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)

    def on_step_end(self, trainer):
        step = trainer.state.global_step
        self._write(f"last-rank{dist.get_rank()}", str(step))
        if step % 5 == 0:
            me = psutil.Process()
            pids = [me.pid] + [c.pid for c in me.children(recursive=True)]
            self._write(f"pids-rank{dist.get_rank()}.json", json.dumps(pids))
            open(os.path.join(self.out, f"at-{step}-rank{dist.get_rank()}"), "w").close()


class CountChildren(Callback):
    def __init__(self, out):
        self.out, self.rows = out, []

    def on_epoch_end(self, trainer):
        # paddle's reader thread frees a stopped iterator's pipes at its 5 s poll: epochs of >= 0.4 s make
        # the first 20 epochs span a poll on any machine, so the count must level off within them
        time.sleep(0.4)
        me = psutil.Process()
        self.rows.append({"epoch": trainer.state.epoch, "children": len(me.children(recursive=True)),
                          "fds": me.num_fds()})
        with open(os.path.join(self.out, "epochs.json"), "w") as f:
            json.dump(self.rows, f)


def main(out, mode, workers):
    args = dict(output_dir=out, per_device_train_batch_size=4, learning_rate=0.01, report_to=[],
                evaluation_strategy="no", save_steps=1000, dataloader_num_workers=workers, logging_steps=4)
    if mode == "syncs":
        counter = CountSyncs()
        trainer = Trainer(make_mlp(), TrainingArguments(max_steps=12, save_strategy="no", **args),
                          train_dataset=ToyDataset(96), loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[counter])
        assert trainer.callbacks.get(Preemption) is not None
        with counter.installed():
            trainer.fit()
        with open(os.path.join(out, f"syncs-rank{dist.get_rank()}.json"), "w") as f:
            json.dump({"per_step": counter.per_step, "sources": [w for _, w in counter.sources]}, f)
        return 0
    if mode == "epochs":
        trainer = Trainer(make_mlp(), TrainingArguments(num_train_epochs=40, save_strategy="no", **args),
                          train_dataset=ToyDataset(16), loss_fn=paddle.nn.CrossEntropyLoss(),
                          callbacks=[CountChildren(out)])
        trainer.fit()
        return 0
    trainer = Trainer(make_mlp(), TrainingArguments(max_steps=100000, **args),
                      train_dataset=Blocking(400, os.path.join(out, "block")), loss_fn=paddle.nn.CrossEntropyLoss(),
                      callbacks=[Mark(out)])
    trainer.remove_callback(StallWatchdog)  # (under a launcher the default one waits 600 s before it reports)
    trainer.add_callback(StallWatchdog(timeout=2.0))
    state = trainer.fit()
    return trainer.callbacks.get(Preemption).exit_code if state.status == "preempted" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0))
