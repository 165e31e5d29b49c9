"""Fencing (issue 32, items 1 and 6): an owner paused past its lease and taken over never writes again; a live
owner in our own PID namespace is never taken over, whatever the clocks say; results.json is never stale.

Real ``ptrain run digits`` processes, real SIGSTOP / SIGCONT, a real other PID namespace (``unshare``), a real
clock 60 s ahead (libfaketime's ``faketime``, for the second command only).
"""

import fcntl
import json
import os
import shutil
import signal
import subprocess
import time

import pytest
from patience import patience
from ownership_procs import (LEASE, Proc, container, digits, env, has_checkpoint, leftovers, lock_of,
                             needs_namespaces, wait_for)

from trainer.checkpoint.fence import GENERATION_FILE
from trainer.checkpoint.lock import LOCK_NAME

pytestmark = pytest.mark.timeout(400)


def pause(proc, out):
    """SIGSTOP every process of ``proc`` (a paused VM, a suspended laptop, a debugger): its heartbeat stops too.

    Not while it holds the guard (the ``flock`` on output_dir, held for a rename or a renewal): a takeover on
    this host would wait for it (correctly) until the process continues."""
    for _ in range(100):
        stopped = proc.tree()
        for p in stopped:
            p.send_signal(signal.SIGSTOP)
        fd = os.open(str(out), os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return stopped
        except BlockingIOError:
            resume(stopped)
            time.sleep(0.05)
        finally:
            os.close(fd)  # (releases the flock if we got it)
    raise AssertionError("the owner always held the guard")


def resume(stopped):
    for p in stopped:
        p.send_signal(signal.SIGCONT)


def manifests(out):
    root = out / "checkpoints"
    return {name: json.loads((root / name / "manifest.json").read_text())
            for name in os.listdir(root) if name.startswith("step-") and (root / name / "manifest.json").exists()}


def metric_records(out):
    with open(out / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if '"loss"' in line]


def run_of(out):
    try:
        return (out / "checkpoints" / "run_id").read_text().strip()
    except OSError:
        return None


def latest_step(out):
    try:
        return int((out / "checkpoints" / "latest").read_text().strip()[len("step-"):])
    except (OSError, ValueError):
        return -1


# ---- item 1: paused past the lease, taken over from elsewhere, then continued --------------------------
@needs_namespaces
@pytest.mark.parametrize("second", ["resume-auto", "overwrite-other-lr"])
def test_a_paused_owner_taken_over_stops_with_7_naming_the_new_owner(tmp_path, procs, second):
    """Before: both runs trained to the end and exited 0, the paused one printing nothing; one output_dir held
    step-4800/5000 of one run beside step-5700/6000 of the other, results.json of one, metrics.jsonl of both."""
    out = tmp_path / "out"
    first = Proc(digits(out, "--logging_steps", "5"), tmp_path, "first")
    procs.append(first)
    wait_for(lambda: has_checkpoint(out) and (lock_of(out) or {}).get("generation") == 1, "a checkpoint", proc=first)
    stopped = pause(first, out)
    paused_at = latest_step(out)
    time.sleep(float(LEASE) + 1)  # past the lease: nothing renews it
    flags = (["--resume_from_checkpoint", "auto"] if second == "resume-auto" else
             ["--overwrite_output_dir", "true", "--learning_rate", "0.01", "--warmup_ratio", "0"])  # lr(5) ~ 0.01
    steps = paused_at + 60
    # another PID namespace (a container on this host): the paused PID cannot be checked from there, so the
    # lease decides and the second command takes the output_dir over
    other = Proc(container(digits(out, *flags, "--logging_steps", "5", steps=steps)), tmp_path, "second")
    procs.append(other)
    wait_for(lambda: (lock_of(out) or {}).get("generation") == 2 or other.p.poll() is not None, "the takeover",
             proc=None)
    owner = lock_of(out)
    wait_for(lambda: other.p.poll() is not None or latest_step(out) > paused_at + 20, "a checkpoint of the second")
    resume(stopped)
    code = first.wait(timeout=patience(240))
    text = first.output()
    assert code == 7, text[-3000:]
    lines = [line for line in text.splitlines() if line.startswith("ptrain: error:")]
    assert len(lines) == 1, text[-3000:]
    assert f"output_dir {out} is no longer this run's" in lines[0] and "took it over (generation 2" in lines[0]
    if owner is not None:
        assert f"process {owner['pid']} on host {owner['host']}" in lines[0], lines[0]
    assert other.wait(timeout=patience(240)) == 0, other.output()[-3000:]
    # one run's files: its checkpoints, its latest, its run id, its metrics, its results
    run_id = run_of(out)
    assert {m["run_id"] for m in manifests(out).values()} == {run_id}
    assert latest_step(out) == steps
    records = metric_records(out)
    got = [r["step"] for r in records]
    assert got == sorted(set(got)) and got[-1] == steps, got  # none written twice, none out of order
    if second == "overwrite-other-lr":
        assert got == list(range(5, steps + 1, 5)), got  # the second run's rows only, from its first step
        assert records[0]["learning_rate"] == pytest.approx(0.01, rel=0.05)
        assert all(int(m["step"]) > 0 for m in manifests(out).values())
    assert json.loads((out / "results.json").read_text())["global_step"] == steps
    assert (out / GENERATION_FILE).read_text().strip() == "2"
    assert not (out / LOCK_NAME).exists() and leftovers(first, other) == []


# ---- a live owner of our own PID namespace: never taken over, whatever the clocks say ------------------
def _faketime_works() -> str:
    if not shutil.which("faketime"):
        return "faketime (Debian's faketime / libfaketime) is not installed"
    done = subprocess.run(["faketime", "-f", "+60s", "python3", "-c", "import time; print(time.time())"],
                          capture_output=True, text=True, timeout=patience(60))
    try:
        ahead = float(done.stdout.strip()) - time.time()
    except ValueError:
        return f"faketime does not run python: {done.stderr.strip()[:200]}"
    return "" if ahead > 50 else f"faketime did not move the clock ({ahead:.0f} s)"


def test_a_paused_owner_or_a_clock_60s_ahead_never_takes_over_a_live_owner_here(tmp_path, procs):
    """Before: a second command whose clock was 60 s ahead (a VM resumed, an NTP step) took over a live owner
    of the same host and PID namespace ("its lease of 3 s expired 57 s ago")."""
    out = tmp_path / "out"
    first = Proc(digits(out), tmp_path, "first")
    procs.append(first)
    wait_for(lambda: has_checkpoint(out) and lock_of(out) is not None, "a checkpoint", proc=first)
    owner = lock_of(out)
    # 1. paused far past its lease: its PID lives, with the start time recorded, so it is never taken over
    stopped = pause(first, out)
    try:
        time.sleep(float(LEASE) * 2)
        second = Proc(digits(out, "--resume_from_checkpoint", "auto", steps=40), tmp_path, "paused")
        procs.append(second)
        assert second.wait(timeout=patience(180)) == 2, second.output()[-3000:]
        assert f"in use by live process {first.p.pid} on" in second.output()
        assert lock_of(out)["token"] == owner["token"]
    finally:
        resume(stopped)
    # 2. a second command whose wall clock is 60 s ahead of the owner's
    why = _faketime_works()
    if why:
        pytest.skip(why)
    ahead = Proc(["faketime", "-f", "+60s", *digits(out, "--resume_from_checkpoint", "auto", steps=40)],
                 tmp_path, "ahead", env=env(FAKETIME_DONT_FAKE_MONOTONIC="1"))
    procs.append(ahead)
    assert ahead.wait(timeout=patience(180)) == 2, ahead.output()[-3000:]
    assert f"in use by live process {first.p.pid} on" in ahead.output()
    now = lock_of(out)
    assert now["token"] == owner["token"] and now["generation"] == 1 and first.p.poll() is None
    first.p.send_signal(signal.SIGTERM)  # the owner carries on untouched: preempted now, it saves and exits 143
    assert first.wait(timeout=patience(180)) == 143, first.output()[-3000:]
    assert not (out / LOCK_NAME).exists() and leftovers(first) == []


# ---- item 6: results.json never describes a run that is not the one in the directory ------------------
def test_results_json_of_a_completed_run_is_gone_once_another_run_claims(tmp_path, procs):
    """Before: --overwrite_output_dir true over a completed run, stopped by SIGTERM (143): results.json still
    said the old run had "completed"."""
    out = tmp_path / "out"
    done = Proc(digits(out, steps=40), tmp_path, "done")
    procs.append(done)
    assert done.wait(timeout=patience(180)) == 0, done.output()[-3000:]
    assert json.loads((out / "results.json").read_text())["status"] == "completed"
    old_run = run_of(out)
    again = Proc(digits(out, "--overwrite_output_dir", "true", "--learning_rate", "0.01"), tmp_path, "again")
    procs.append(again)
    wait_for(lambda: run_of(out) not in (None, old_run) and has_checkpoint(out), "a checkpoint of the new run",
             proc=again)
    assert not (out / "results.json").exists()  # removed at the claim, before any step
    again.p.send_signal(signal.SIGTERM)
    assert again.wait(timeout=patience(180)) == 143, again.output()[-3000:]
    assert not (out / "results.json").exists()
    resumed = Proc(digits(out, "--resume_from_checkpoint", "auto", "--learning_rate", "0.01", steps=latest_step(out) + 20),
                   tmp_path, "resumed")
    procs.append(resumed)
    assert resumed.wait(timeout=patience(180)) == 0, resumed.output()[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "completed" and results["global_step"] == latest_step(out)
