"""Worker for the persistent DataLoader worker tests (tests/trainer/test_persistent_workers.py).

usage: persistent_toy.py OUT_DIR MODE PERSISTENT(0|1)

Trains an MLP with 2 DataLoader workers on samples with random noise drawn from numpy's global RNG
(each fetch appended to OUT_DIR/draws-<worker pid>.txt as ``index draw``), evaluating every epoch
on a set of its own with 2 workers.

MODE ``completed``: 3 epochs. ``stopped``: stopped at step 10 (epoch 1). ``failed``: a callback raises
at step 10. ``resume``: stopped at step 10 with a checkpoint there, then a new Trainer resumes it to the
end of the 3 epochs. Each writes OUT_DIR/result.json: the live child processes at every epoch end and
evaluation end (``seen``), after fit() (``after``), the final parameters (``params``), the status.
MODE ``hold``: trains slowly for good; OUT_DIR/pids.json (this process and its children) and
OUT_DIR/ready once an evaluation ran and step 10 is done (for SIGTERM / kill -9 from the test).
"""

import json
import os
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))
sys.path.append(TESTS)

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import psutil  # noqa: E402
from helpers import StopAt, ToyDataset, make_mlp  # noqa: E402

from callbacks import Callback  # noqa: E402
from trainer import Trainer, TrainingArguments  # noqa: E402


def live_children():
    return sorted(c.pid for c in psutil.Process().children(recursive=True)
                  if c.is_running() and c.status() != psutil.STATUS_ZOMBIE)


class Noisy(ToyDataset):
    def __init__(self, n, out, pause=0.0):
        super().__init__(n)
        self.out, self.pause = out, pause

    def __getitem__(self, i):
        noise = np.random.randn(8).astype("float32")
        with open(os.path.join(self.out, f"draws-{os.getpid()}.txt"), "a") as f:
            f.write(f"{i} {float(noise[0])!r}\n")
        time.sleep(self.pause)
        return self.x[i] + noise, self.y[i]


class Watch(Callback):
    def __init__(self, out, mode):
        self.out, self.mode, self.seen, self.evals = out, mode, [], 0

    def on_epoch_end(self, trainer):
        self.seen.append(["epoch", trainer.state.epoch, live_children()])

    def on_eval_end(self, trainer):
        self.evals += 1
        self.seen.append(["eval", trainer.state.epoch, live_children()])

    def on_step_end(self, trainer):
        step = trainer.state.global_step
        if self.mode == "failed" and step == 10:
            raise RuntimeError("failed on purpose at step 10")
        if self.mode == "hold" and step >= 10 and self.evals and not os.path.exists(os.path.join(self.out, "ready")):
            with open(os.path.join(self.out, "pids.json"), "w") as f:
                json.dump([os.getpid()] + live_children(), f)
            open(os.path.join(self.out, "ready"), "w").close()


def trainer_for(out, mode, persistent, callbacks):
    hold = mode == "hold"
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, per_device_eval_batch_size=8,
                             learning_rate=0.05, report_to=[], num_train_epochs=100000 if hold else 3,
                             evaluation_strategy="steps" if hold else "epoch", eval_steps=8,
                             save_strategy="steps" if mode == "resume" else "no", save_steps=10,
                             dataloader_num_workers=2, dataloader_persistent_workers=bool(persistent),
                             logging_steps=5, seed=7)
    return Trainer(make_mlp(), args, train_dataset=Noisy(32, out, 0.01 if hold else 0.0),
                   eval_dataset=ToyDataset(24, seed=1), loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=callbacks)


def main(out, mode, persistent):
    watch = Watch(out, mode)
    trainer = trainer_for(out, mode, persistent, [watch] + ([StopAt(10)] if mode in ("stopped", "resume") else []))
    error = None
    try:
        trainer.fit()
    except Exception as exc:  # noqa: BLE001 - the failed mode's CallbackError, recorded for the test
        error = str(exc)
    after = live_children()
    if mode == "resume":
        trainer = trainer_for(out, mode, persistent, [watch])
        trainer.fit(resume_from_checkpoint="auto")
        after = live_children()
    result = {"seen": watch.seen, "after": after, "status": trainer.state.status, "error": error,
              "step": trainer.state.global_step,
              "params": {k: v.numpy().tolist() for k, v in trainer.model.state_dict().items()}}
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
