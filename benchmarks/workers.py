"""What keeping DataLoader workers across epochs and evaluations saves
(``dataloader_persistent_workers``): CPU seconds (the training process and its
workers) and wall seconds per epoch of a ``trainer.Trainer.fit()`` with an
evaluation after every epoch, workers kept against new workers every pass.

Each run is a fresh process (a tiny MLP, ``--samples`` in-memory samples with a
little numpy work each, ``--workers`` workers, ``--epochs`` epochs); the two
settings alternate over ``--repeats`` rounds and the report gives medians and
the ratio kept / new. Worker CPU is counted once the workers are joined (fit()
ends them), so the whole run is measured, start-up included.

Run::

    python -m benchmarks workers                  # 512 samples, 2 workers, 6 epochs, 3 rounds
    python -m benchmarks workers --workers 4 --repeats 5
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks import common
from benchmarks.common import (
    emit,
    fmt,
    load_line,
    markdown_table,
    median,
    quiet_paddle_warnings,
    run_child,
    spread_pct,
    write_outputs,
)


def child(samples: int, workers: int, epochs: int, persistent: bool) -> dict:
    quiet_paddle_warnings()
    import tempfile

    import numpy as np
    import paddle

    from benchmarks.dataloader import cpu_seconds
    from trainer import Trainer, TrainingArguments

    class Samples(paddle.io.Dataset):
        def __init__(self, n):
            self.x = np.random.RandomState(0).randn(n, 64).astype("float32")

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):  # a little work per sample, as an augmentation does
            return (self.x[i] + np.random.randn(64).astype("float32") * 0.1), np.int64(i % 4)

    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(64, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 4))
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=32, per_device_eval_batch_size=64,
                                 num_train_epochs=epochs, evaluation_strategy="epoch", save_strategy="no",
                                 report_to=[], logging_steps=1000, dataloader_num_workers=workers,
                                 dataloader_persistent_workers=persistent)
        trainer = Trainer(model, args, train_dataset=Samples(samples), eval_dataset=Samples(samples // 2),
                          loss_fn=paddle.nn.CrossEntropyLoss())
        cpu0, wall0 = cpu_seconds(), time.perf_counter()
        trainer.fit()  # ends the workers: their CPU time is in RUSAGE_CHILDREN from here on
        cpu, wall = cpu_seconds() - cpu0, time.perf_counter() - wall0
    return {"cpu_per_epoch": cpu / epochs, "wall_per_epoch": wall / epochs, "persistent": persistent}


def report(rows, args) -> str:
    setting = (f"{args.samples} samples, {args.workers} workers, {args.epochs} epochs with an evaluation after "
               f"each ({args.samples // 2} samples), {args.repeats} interleaved rounds; {load_line()}")
    lines = ["# DataLoader workers kept across passes", "", setting, ""]
    table = []
    by = {p: [r for r in rows if r["persistent"] == p] for p in (False, True)}
    for p in (False, True):
        cpu = [r["cpu_per_epoch"] * 1e3 for r in by[p]]
        wall = [r["wall_per_epoch"] * 1e3 for r in by[p]]
        table.append(["kept (default)" if p else "new every pass", fmt(median(cpu), 1), f"{spread_pct(cpu):.0f}%",
                      fmt(median(wall), 1), f"{spread_pct(wall):.0f}%"])
    ratio_cpu = median([r["cpu_per_epoch"] for r in by[True]]) / median([r["cpu_per_epoch"] for r in by[False]])
    ratio_wall = median([r["wall_per_epoch"] for r in by[True]]) / median([r["wall_per_epoch"] for r in by[False]])
    table.append(["ratio kept / new", fmt(ratio_cpu, 3), "", fmt(ratio_wall, 3), ""])
    lines.append(markdown_table(["workers", "CPU ms / epoch", "spread", "wall ms / epoch", "spread"], table))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = common.Parser(prog="python -m benchmarks workers", description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--markdown", type=common.output_file, help="also write the report to this file")
    p.add_argument("--json", type=common.output_file, help="write the raw measurements to this file")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)  # persistent: 0 or 1
    args = p.parse_args(argv)
    if args.child is not None:
        emit(child(args.samples, args.workers, args.epochs, bool(args.child)))
        return 0
    rows = []
    for _ in range(args.repeats):
        for persistent in (0, 1):
            rows.append(run_child([sys.executable, "-m", "benchmarks.workers", "--child", str(persistent),
                                   "--samples", str(args.samples), "--workers", str(args.workers),
                                   "--epochs", str(args.epochs)]))
    markdown = report(rows, args)
    print(markdown)
    write_outputs(markdown, {"rows": rows, "args": vars(args)}, args.markdown, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
