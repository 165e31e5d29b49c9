"""The training loops that ``benchmarks.overhead`` compares, and the clock they share.

Each ``run_<variant>(wl, model, dataset, optimizer, loss_fn, clock, out_dir, seed)``
trains ``clock.total`` steps of the workload ``wl`` (``benchmarks.workloads``)
and calls ``clock.tick()`` at the end of every step: the bare loop inline,
the frameworks from their step-end callback. They return extra facts for the
report (our Trainer: the callbacks and the time spent in each).

The bare loop is the one of the foundation issue::

    loader = DataLoader(dataset, batch_sampler=DistributedBatchSampler(dataset, batch_size=32, shuffle=True))
    for data, label in loader:
        loss = loss_fn(model(data), label)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
"""

from __future__ import annotations

import sys
import time
from typing import List, Optional

NEED_CHECKPOINTS = ("LossSpikeRecovery",)  # callbacks that refuse save_strategy="no"
ONCE_PER_FIT = ("fit_begin", "fit_end", "exception", "load_begin", "load_end")  # outside the timed window

class StepClock:
    """Host time at the end of every step; CPU time (``process_time``: all threads)
    and the training thread's own CPU time (``thread_time``) at the end of the
    warm-up and of every slice of ``slice_steps`` steps after it.

    ``summary()`` gives the whole window (steps/s, ms/step, CPU ms/step, the CPU
    of the threads other than the training thread per step) and the fastest slice
    (``best_slice_ms``, ``best_slice_cpu_ms``): on a machine where other work comes
    and goes, the fastest slice of ~10 is close to what the loop costs when it has
    the cores to itself (the ``min`` of timeit, per process). With :meth:`start`
    called before the loop is built, it adds the one-time set-up: wall and CPU
    time from ``start()`` to the end of the first step (building the trainer,
    starting the loggers and workers, the first step), and what that exceeds
    one measured step by (``setup_extra_*``: the cost paid once, not per step).
    """

    def __init__(self, warmup: int, total: int, slices: int = 10):
        self.warmup, self.total = warmup, total
        self.slice_steps = max(1, (total - warmup) // slices)
        self.marks: List[float] = []
        self.cpu_marks: List[float] = []
        self.thread_marks: List[float] = []
        self.started: Optional[tuple] = None
        self.first: Optional[tuple] = None

    def start(self) -> None:
        """The loop is about to be built (the Trainer, its loggers) and run."""
        self.started = (time.perf_counter(), time.process_time())

    def tick(self) -> None:
        self.marks.append(time.perf_counter())
        done = len(self.marks) - self.warmup
        if done >= 0 and done % self.slice_steps == 0:
            self.cpu_marks.append(time.process_time())
            self.thread_marks.append(time.thread_time())
        if len(self.marks) == 1 and self.started is not None:
            self.first = (self.marks[0], time.process_time())

    def summary(self) -> dict:
        if len(self.marks) != self.total:
            raise RuntimeError(f"the loop ran {len(self.marks)} steps, {self.total} were asked")
        measured, k = self.total - self.warmup, self.slice_steps
        window = self.marks[-1] - self.marks[self.warmup - 1]
        walls = [self.marks[self.warmup - 1 + (i + 1) * k] - self.marks[self.warmup - 1 + i * k]
                 for i in range(measured // k)]
        cpus = [b - a for a, b in zip(self.cpu_marks, self.cpu_marks[1:])]
        cpu_total = self.cpu_marks[-1] - self.cpu_marks[0]
        thread_total = self.thread_marks[-1] - self.thread_marks[0]
        cpu_steps = (len(self.cpu_marks) - 1) * k
        out = {"steps": measured, "seconds": window, "steps_per_s": measured / window,
               "ms_per_step": 1e3 * window / measured, "cpu_ms_per_step": 1e3 * cpu_total / cpu_steps,
               "other_threads_cpu_ms_per_step": 1e3 * (cpu_total - thread_total) / cpu_steps,
               "slice_steps": k, "best_slice_ms": 1e3 * min(walls) / k, "best_slice_cpu_ms": 1e3 * min(cpus) / k}
        if self.first is not None:
            setup_s, setup_cpu_s = self.first[0] - self.started[0], self.first[1] - self.started[1]
            out.update(setup_s=setup_s, setup_cpu_s=setup_cpu_s,
                       setup_extra_s=setup_s - window / measured, setup_extra_cpu_s=setup_cpu_s - cpu_total / cpu_steps)
        return out


def run_bare(wl, model, dataset, optimizer, loss_fn, clock, out_dir, seed) -> dict:
    import paddle
    from paddle.io import DataLoader, DistributedBatchSampler

    paddle.seed(seed)
    loader = DataLoader(dataset, batch_sampler=DistributedBatchSampler(dataset, batch_size=wl.batch_size, shuffle=True))
    step = 0
    while step < clock.total:
        for data, label in loader:
            loss = loss_fn(model(data), label)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
            clock.tick()
            step += 1
            if step == clock.total:
                break
    return {}


def _our_args(wl, clock, out_dir, seed, **overrides):
    from trainer import TrainingArguments

    values = dict(output_dir=out_dir, per_device_train_batch_size=wl.batch_size, max_steps=clock.total,
                  save_strategy="no", seed=seed)
    values.update(overrides)
    return TrainingArguments(**values)


def _clock_callback(clock):
    from callbacks import Callback

    class Clock(Callback):
        order = 10_000  # after every other callback's on_step_end

        def on_step_end(self, trainer):
            clock.tick()

    return Clock()


def all_builtin_callbacks(args, include_defaults: bool = False) -> list:
    """One instance of every built-in callback that ``callbacks`` exports and
    ``default_callbacks(args)`` does not already add, configured so that
    training stays what it is (AMP in bfloat16: a no-op on a CPU; LRWarmup over
    1 step: the first step at half the learning rate; EarlyStopping: no
    evaluation set, so it only warns; Export: after training, outside the
    timed window, with a loose check)."""
    import callbacks as cb_pkg
    from callbacks import Callback, default_callbacks

    configs = {
        "AMP": dict(dtype="bfloat16"),
        "LRWarmup": dict(warmup_steps=1),
        "EarlyStopping": dict(metric="eval_loss", patience=3),
        "GPUUtilizationMonitor": dict(interval=1.0),
        "NaNGuard": dict(),
        # loose check: what is timed is the steps, and on a CPU paddle.inference's ResNet-50 differs from
        # dygraph by more than Export's default 1e-5 (a fresh model: 1e-3 on logits up to ~580)
        "Export": dict(rtol=0.05, atol=5.0),
        "Rank0Logger": dict(report_to=["tqdm", "jsonl", "visualdl"]),  # only added when args.report_to is empty
    }
    defaults = {type(cb) for cb in default_callbacks(args)}
    out = []
    for name in getattr(cb_pkg, "__all__", []):
        obj = getattr(cb_pkg, name, None)
        if not (isinstance(obj, type) and issubclass(obj, Callback)) or obj is Callback \
                or (obj in defaults and not include_defaults):
            continue
        try:
            out.append(obj(**configs.get(name, {})))
        except TypeError as exc:  # a new callback with required options: say so, measure the rest
            print(f"ours-all: left out {name}: {exc}", file=sys.stderr)
    return out


def run_ours(wl, model, dataset, optimizer, loss_fn, clock, out_dir, seed, variant) -> dict:
    from trainer import Trainer

    base, *only = variant.split("+")  # "ours-quiet+NaNGuard": the quiet defaults plus one callback
    base, _, without = base.partition("-without-")  # "ours-quiet-without-NaNGuard": the quiet defaults minus one
    overrides = {"ours-quiet": {"report_to": []}, "ours-read-ahead": {"dataloader_read_ahead": True}}.get(base, {})
    args = _our_args(wl, clock, out_dir, seed, **overrides)
    extra = all_builtin_callbacks(args) if base == "ours-all" else []
    if only:
        # a named default too (NaNGuard: the user's instance replaces the default one, trainer callback_set)
        extra = [cb for cb in all_builtin_callbacks(args, include_defaults=True) if type(cb).__name__ in only]
        missing = set(only) - {type(cb).__name__ for cb in extra}
        if missing:
            raise ValueError(f"variant {variant!r}: no built-in callback named {', '.join(sorted(missing))}")
    if any(type(cb).__name__ in NEED_CHECKPOINTS for cb in extra):
        # it refuses save_strategy='no'; a save interval longer than the run saves once, after the last timed step
        args = _our_args(wl, clock, out_dir, seed, save_strategy="steps", save_steps=10 ** 6, **overrides)
    trainer = Trainer(model, args, train_dataset=dataset, loss_fn=loss_fn, optimizer=optimizer,
                      callbacks=[_clock_callback(clock), *extra])
    if without:  # what one default callback costs: the run without it
        dropped = [cb for cb in trainer.callbacks if type(cb).__name__ == without]
        if not dropped:
            raise ValueError(f"variant {variant!r}: the default set has no {without}")
        trainer.remove_callback(type(dropped[0]))
    state = trainer.fit()
    names = [type(cb).__name__ for cb in trainer.callbacks if type(cb).__name__ != "Clock"]
    per_step = {f"{name}.on_{event}": 1e3 * secs / clock.total for (name, event), secs in trainer.callbacks.timings.items()
                if name != "Clock" and event not in ONCE_PER_FIT}
    return {"status": state.status, "callbacks": names, "report_to": list(args.report_to), "save_strategy": args.save_strategy,
            "logging_steps": args.logging_steps, "callback_ms_per_step": dict(sorted(per_step.items(), key=lambda kv: -kv[1]))}


def run_paddlenlp(wl, model, dataset, optimizer, loss_fn, clock, out_dir, seed) -> dict:
    import paddle
    from paddle.io.dataloader.collate import default_collate_fn
    from paddlenlp.trainer import Trainer, TrainerCallback, TrainingArguments

    from benchmarks.workloads import DictView

    class SameShuffle(Trainer):
        """The bare loop's sampler: PaddleNLP's single-process default shuffles in another order."""

        def _get_train_sampler(self):
            return paddle.io.DistributedBatchSampler(self.train_dataset, batch_size=self.args.per_device_train_batch_size,
                                                     shuffle=True, drop_last=self.args.dataloader_drop_last)

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick()

    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=wl.batch_size, max_steps=clock.total,
                             report_to=["none"], max_grad_norm=0.0, lr_scheduler_type="constant",
                             save_strategy="no", logging_steps=10, seed=seed, dataloader_num_workers=0)
    trainer = SameShuffle(model=model, criterion=loss_fn, args=args, train_dataset=DictView(dataset, wl.input_name),
                          data_collator=default_collate_fn, optimizers=(optimizer, None), callbacks=[Clock()])
    trainer.train()
    return {}


def run_hapi(wl, model, dataset, optimizer, loss_fn, clock, out_dir, seed) -> dict:
    import paddle
    from paddle.static import InputSpec

    class Clock(paddle.callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            clock.tick()

    paddle.seed(seed)
    hapi = paddle.Model(model, inputs=[InputSpec([None, *wl.input_shape], wl.input_dtype, wl.input_name)],
                        labels=[InputSpec([None], "int64", "labels")])
    hapi.prepare(optimizer, loss_fn)
    hapi.fit(train_data=dataset, batch_size=wl.batch_size, epochs=1 + clock.total // max(1, len(dataset) // wl.batch_size),
             shuffle=True, verbose=0, num_iters=clock.total, callbacks=[Clock()])
    return {}
