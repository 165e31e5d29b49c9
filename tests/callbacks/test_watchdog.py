"""StallWatchdog in real runs: a stalled step is reported with the rank and the
stacks of its threads; action='stop' ends the process with 124 (and the GIL
backstop with 1); under two processes rank 0 names the slow rank, and a stall
in one rank ends the whole launched job."""

import doctest
import json
import logging
import os
import subprocess
import sys
import time

import paddle
import pytest
from helpers import REPO, ToyDataset, free_port, make_mlp
from patience import patience

import callbacks.watchdog
from callbacks import Callback, StallWatchdog, default_callbacks
from trainer import Trainer, TrainingArguments
from trainer.errors import ConfigError

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "watchdog_toy.py")


class SleepyDataset(ToyDataset):
    """ToyDataset whose ``sleep_at``-th fetch sleeps ``seconds``, and every fetch ``each`` seconds."""

    def __init__(self, n=64, sleep_at=None, seconds=0.0, each=0.0):
        super().__init__(n)
        self.sleep_at, self.seconds, self.each = sleep_at, seconds, each
        self.fetched = 0

    def __getitem__(self, i):
        self.fetched += 1
        if self.fetched == self.sleep_at:
            time.sleep(self.seconds)
        elif self.each:
            time.sleep(self.each)
        return super().__getitem__(i)


def fit(tmp_path, watchdog, data, **overrides):
    values = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=8, logging_steps=4,
                  report_to=[], save_strategy="no")
    values.update(overrides)
    trainer = Trainer(make_mlp(), TrainingArguments(**values), train_dataset=data, loss_fn=paddle.nn.CrossEntropyLoss(),
                      callbacks=[watchdog])
    return trainer.fit()


def test_a_stalled_step_is_reported_with_the_rank_and_the_stacks(tmp_path, caplog):
    watchdog = StallWatchdog(timeout=0.3)
    with caplog.at_level(logging.WARNING, logger="callbacks.watchdog"):
        state = fit(tmp_path, watchdog, SleepyDataset(sleep_at=30, seconds=1.2))  # in the 4th batch
    assert state.status == "completed" and state.global_step == 8  # 'warn': the run goes on
    (stall,) = watchdog.stalls
    assert stall["rank"] == 0 and stall["phase"] == "training" and 0.3 <= stall["seconds"] < 1.2
    assert stall["step"] in (2, 3)  # the loader thread fetches a batch ahead of the step that needs it
    with open(os.path.join(tmp_path, "stall-rank0.txt")) as f:
        report = f.read()
    assert report.startswith("StallWatchdog: rank 0 has finished no training step for ")
    assert f"last finished step {stall['step']}" in report
    assert "in __getitem__" in report and os.path.basename(__file__) in report  # the dataset's frame
    assert "_train_step" in report and "MainThread" in report and "StallWatchdog-rank0" in report
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "rank 0 has finished no training step" in logged and "in __getitem__" in logged
    assert "after a stall of" in logged  # and it says when the rank came back


class SlowSave(Callback):
    order = 150  # after the watchdog paused its clock in on_save_begin

    def on_save_begin(self, trainer):
        time.sleep(0.8)


def test_long_evaluation_and_saving_do_not_trip_it(tmp_path):
    # evaluation: 10 batches of 80 ms (0.8 s in all, over the 0.3 s timeout), each batch a heartbeat;
    # saving: 0.8 s with the clock paused
    watchdog = StallWatchdog(timeout=0.3)
    values = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, per_device_eval_batch_size=4, max_steps=4,
                  logging_steps=2, report_to=[], evaluation_strategy="steps", eval_steps=2, save_strategy="steps",
                  save_steps=2, save_async=False)
    trainer = Trainer(make_mlp(), TrainingArguments(**values), train_dataset=SleepyDataset(),
                      eval_dataset=SleepyDataset(40, each=0.02), loss_fn=paddle.nn.CrossEntropyLoss(),
                      callbacks=[watchdog, SlowSave()])
    state = trainer.fit()
    assert state.status == "completed" and "eval_loss" in state.metrics
    assert watchdog.stalls == []
    assert not os.path.exists(os.path.join(tmp_path, "stall-rank0.txt"))


def run_worker(tmp_path, mode):
    out = str(tmp_path / mode)
    os.makedirs(out)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, WORKER, out, mode], capture_output=True, text=True, timeout=patience(120), cwd=REPO)
    return out, proc, time.monotonic() - start


def test_stop_ends_the_process_with_124(tmp_path):
    out, proc, elapsed = run_worker(tmp_path, "stop")
    assert proc.returncode == StallWatchdog.EXIT_CODE == 124, proc.stderr[-3000:]
    assert elapsed < 40  # the sample would have taken 60 s
    assert "rank 0 has finished no training step" in proc.stderr
    assert "stopping this process with exit code 124" in proc.stderr and "in __getitem__" in proc.stderr
    with open(os.path.join(out, "stall-rank0.txt")) as f:
        assert "in __getitem__" in f.read()
    assert not os.path.exists(os.path.join(out, "watchdog-rank0.json"))  # fit() never returned


def test_a_call_holding_the_gil_is_caught_by_the_faulthandler_backstop(tmp_path):
    out, proc, elapsed = run_worker(tmp_path, "gil")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert elapsed < 40
    assert "Timeout (0:00:00.500000)!" in proc.stderr and "in __getitem__" in proc.stderr


def test_options_are_validated():
    for bad in (dict(timeout=0), dict(timeout="10"), dict(action="kill"), dict(slow_factor=1.0),
                dict(check_interval=-1), dict(repeat_every=0)):
        with pytest.raises(ConfigError, match="StallWatchdog"):
            StallWatchdog(**bad)
    assert StallWatchdog(timeout=0.5).check_interval == 0.05


def test_on_by_default_only_with_several_processes(monkeypatch):
    args = TrainingArguments(report_to=[])
    assert not any(isinstance(cb, StallWatchdog) for cb in default_callbacks(args))
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    (watchdog,) = [cb for cb in default_callbacks(args) if isinstance(cb, StallWatchdog)]
    assert (watchdog.timeout, watchdog.action) == (600.0, "warn")


def test_docstring_example():
    assert doctest.testmod(callbacks.watchdog).failed == 0


# ---- two processes -------------------------------------------------------------------------
def launch_worker(base, mode):
    out, logs = str(base / mode), str(base / f"{mode}-logs")
    os.makedirs(out)
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--master",
           f"127.0.0.1:{free_port()}", "--log_dir", logs, WORKER, out, mode]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=patience(180), env=env, cwd=REPO)
    worker_logs = {}
    for rank in (0, 1):
        with open(os.path.join(logs, f"workerlog.{rank}"), errors="replace") as f:
            worker_logs[rank] = f.read()
    return out, proc, worker_logs, time.monotonic() - start


def test_two_processes_rank_0_names_the_slow_rank(tmp_path):
    out, proc, logs, _ = launch_worker(tmp_path, "slow")
    assert proc.returncode == 0, proc.stdout[-2000:] + logs[0][-2000:] + logs[1][-2000:]
    results = []
    for rank in (0, 1):
        with open(os.path.join(out, f"watchdog-rank{rank}.json")) as f:
            results.append(json.load(f))
    r0, r1 = results
    assert r0["global_step"] == r1["global_step"] == 13 and r0["stalls"] == r1["stalls"] == []
    first = r0["slow_reports"][0]
    assert first["rank"] == 1 and first["step"] == 4  # the first log record already names it
    # 80 ms of sleeping per batch, some of it hidden by the loader thread's prefetch while the rank waits for rank 1
    assert first["work_time"] > 0.04 and first["ratio"] > 3 and first["data_wait"] > 0.03
    assert [r["rank"] for r in r0["slow_reports"]] == [r["rank"] for r in r1["slow_reports"]]  # every rank agrees
    assert "StallWatchdog: rank 1 is slow" in logs[0]
    assert "is slow" not in logs[1]  # the warning comes from rank 0 only


def test_two_processes_a_stalled_rank_ends_the_job(tmp_path):
    out, proc, logs, elapsed = launch_worker(tmp_path, "stall")
    # paddle's launcher exits with the code of the lowest failed rank: 124 when rank 0's own watchdog ends it
    # first, 250 (SIGABRT) when gloo aborts rank 0 the moment rank 1 leaves its all-reduce (a race of ~ms)
    assert proc.returncode in (124, 250), proc.stdout[-2000:]
    assert elapsed < 60  # rank 1's sample would have taken 60 s, then rank 0 would wait in the all-reduce
    with open(os.path.join(out, "stall-rank1.txt")) as f:
        stuck = f.read()
    with open(os.path.join(out, "stall-rank0.txt")) as f:
        waiting = f.read()
    assert stuck.startswith("StallWatchdog: rank 1 ") and "in __getitem__" in stuck  # the culprit
    assert "in backward" in waiting  # rank 0 waits in the gradient all-reduce
    # both reports blame rank 1, from the progress the ranks share outside the blocked collective
    behind = "StallWatchdog: rank 1 is behind: in step 4, before the gradient exchange (loading data or computing); "
    assert stuck.startswith(behind + "rank 0 waits for it; rank 1 has finished no training step"), stuck[:400]
    assert waiting.startswith(behind + "rank 0 waits for rank 1 (in the gradient exchange or optimizer update of "
                              "step 4); rank 0 has finished no training step"), waiting[:400]
    assert "StallWatchdog: rank 1 is behind" in logs[0] and "StallWatchdog: rank 1 is behind" in logs[1]
    assert "stopping this process with exit code 124" in logs[0] + logs[1]


def test_blame_names_the_rank_behind_a_silent_one_and_a_dead_one(tmp_path):
    """The blame sentence from progress files as three ranks would write them (rank 0 reads them)."""
    import doctest

    import callbacks.stall_blame
    from callbacks.stall_blame import PROGRESS_DIR, ProgressBoard

    assert doctest.testmod(callbacks.stall_blame).failed == 0
    board = ProgressBoard(str(tmp_path), rank=0, world_size=3, check_interval=0.1)
    os.makedirs(tmp_path / PROGRESS_DIR)

    def write(rank, key, age):
        with open(tmp_path / PROGRESS_DIR / f"rank{rank}.json", "w") as f:
            json.dump({"rank": rank, "key": key, "where": "x", "time": time.time() - age, "pid": 1}, f)

    write(1, [6, 1, 0], 0.1)
    write(2, [6, 2, 0], 0.1)
    mark = (6, 2, 0)
    assert board.blame(mark) == ("rank 1 is behind: x; rank 0 waits for rank 1 (in the gradient exchange or optimizer "
                                 "update of step 7)")
    write(1, [6, 1, 0], 30.0)
    assert board.blame(mark).startswith("rank 1 is behind: x (no sign of life for 30 s)")
    os.remove(tmp_path / PROGRESS_DIR / "rank1.json")
    assert board.blame(mark) == ("rank 1 shared no progress (dead before its first check, or output_dir is not "
                                 "shared); rank 0 waits for rank 1 (in the gradient exchange or optimizer update of "
                                 "step 7)")
    write(1, [6, 2, 0], 0.1)
    assert board.blame(mark).startswith("every rank is at the same point")
    assert board.blame((6, 1, 0)) == ("rank 0 is behind: in step 7, before the gradient exchange (loading data or "
                                      "computing); ranks 1, 2 wait for it")
    board.publish((6, 1, 0))
    with open(board.path(0)) as f:
        assert json.load(f)["key"] == [6, 1, 0]
    board.remove()
    assert not os.path.exists(board.path(0))


def test_a_stopping_rank_waits_for_the_reports_of_ranks_alive_only(tmp_path):
    """ProgressBoard.wait_for_reports: a rank that has reported, or whose file stopped changing, or that has no file
    is not waited for; a live rank without a report is, until the grace runs out (then it is named)."""
    import threading

    from callbacks.stall_blame import ProgressBoard

    boards = [ProgressBoard(str(tmp_path), r, 4, check_interval=0.05) for r in range(4)]
    boards[1].publish((3, 1, 0), reported=True)
    boards[2].publish((3, 2, 0))  # alive, in the collective, not reported yet
    start = time.monotonic()
    assert boards[0].wait_for_reports(0.3, 0.02) == [2] and time.monotonic() - start >= 0.3  # rank 3: no file
    later = threading.Timer(0.2, lambda: boards[2].publish((3, 2, 0), reported=True))
    later.start()
    start = time.monotonic()
    assert boards[0].wait_for_reports(30, 0.02) == [] and time.monotonic() - start < 20
    later.join()
    boards[2].publish((3, 2, 0))
    stale = time.time() - 2 * boards[0].fresh_within
    info = json.loads(open(boards[0].path(2)).read())
    info["time"] = stale
    with open(boards[0].path(2), "w") as f:
        json.dump(info, f)
    assert boards[0].wait_for_reports(30, 0.02) == []  # no sign of life: not waited for
