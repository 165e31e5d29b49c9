"""Ownership where jobs run: containers (their own PID namespace, the entry point is PID 1), other hosts
(``unshare -u``: another hostname), two commands of one job id. Real ``ptrain run digits`` processes, real
kill -9, real namespaces; the lease is shortened to LEASE seconds (``PTRAIN_LOCK_LEASE_SECONDS``).

Issue 19: 4 (a container killed by kill -9 and restarted), 5 (a second command from another PID namespace or
host touched nothing of the live job), 6 (a second command with the same --job_id).
"""

import signal

import pytest
from patience import patience
from ownership_procs import (Proc, container, digits, env, has_checkpoint, leftovers, lock_of, metric_steps,
                             needs_namespaces, wait_for)

from trainer.checkpoint.lock import LOCK_NAME

pytestmark = pytest.mark.timeout(300)


# ---- 4: a container killed by kill -9 and restarted the same way ------------------------------
@needs_namespaces
def test_container_killed_and_restarted_resumes_after_the_lease(tmp_path, procs):
    """Before: "output_dir ... is in use by live process 1" (the restarted container's own PID 1), exit 2, for good."""
    out, lease = tmp_path / "out", "12"  # longer than ptrain's start-up: the restart meets a lease still running
    cmd = container(digits(out, "--resume_from_checkpoint", "auto"))
    first = Proc(cmd, tmp_path, "first", env=env(PTRAIN_LOCK_LEASE_SECONDS=lease))
    procs.append(first)
    wait_for(lambda: has_checkpoint(out) and (lock_of(out) or {}).get("pid") == 1, "a checkpoint", proc=first)
    first.kill9_entry_point()
    assert first.wait(timeout=patience(60)) != 0
    assert lock_of(out)["pid"] == 1  # left behind by the killed container
    # the newest checkpoint, which resume auto takes: a kill between a save's rename and its move of `latest`
    # leaves `latest` one save behind (seen under load: latest step-40, step-80 complete)
    done = max(int(p.name[len("step-"):]) for p in (out / "checkpoints").glob("step-*"))
    steps = done + 20
    second = Proc(container(digits(out, "--resume_from_checkpoint", "auto", steps=steps)), tmp_path, "second",
                  env=env(PTRAIN_LOCK_LEASE_SECONDS=lease))
    procs.append(second)
    code = second.wait()
    text = second.output()
    assert code == 0, text[-3000:]
    # the restart says why the lock is stale: the kernel gave the new namespace the old one's id and PID 1 is a
    # younger process; or it waited for the rest of the lease (or, started late, found it expired)
    paths = {"pid reused": "process 1 is gone (the PID now belongs to another process)",
             "waited": f"did not renew its lease of {lease} s", "expired": f"its lease of {lease} s expired"}
    seen = [name for name, line in paths.items() if line in text]
    print("container restart:", seen)
    assert len(seen) == 1, text[-3000:]
    if seen == ["waited"]:  # (after "expired" the namespace may be named or not: the kernel may reuse its id)
        assert "another PID namespace" in text, text[-3000:]
    assert ("waiting up to" in text) == (seen == ["waited"]), text[-3000:]
    assert "resum" in text.lower(), text[-3000:]
    assert not (out / LOCK_NAME).exists() and (out / "checkpoints" / f"step-{steps}").is_dir()
    assert leftovers(first, second) == []


# ---- 5: a second command from another PID namespace / another host touches nothing ------------------
@needs_namespaces
@pytest.mark.parametrize("second", ["other-pid-namespace-same-job", "other-pid-namespace-other-job",
                                    "other-host-same-job"])
def test_second_command_from_elsewhere_is_refused_and_touches_nothing(tmp_path, procs, second):
    """Before: the second command took the owner's PID (2 in its container) for dead, took the lock over and
    deleted the live writer's .tmp-step-N-2: the healthy job died with exit 5."""
    out = tmp_path / "out"
    first = Proc(container(digits(out, "--job_id", "j19"), shell_first=True), tmp_path, "first")
    procs.append(first)
    wait_for(lambda: has_checkpoint(out) and lock_of(out) is not None, "a checkpoint", proc=first)
    owner = lock_of(out)
    assert owner["pid"] != 1  # the shell is PID 1: the owner's PID is one the second container does not have
    in_flight = out / "checkpoints" / f".tmp-step-99999-{owner['pid']}"  # a save of the live writer, in flight
    in_flight.mkdir()
    (in_flight / "model.safetensors").write_bytes(b"x" * 64)
    job = ["--job_id", "j19"] if second.endswith("same-job") else []
    host = "other-node" if second.startswith("other-host") else None
    other = Proc(container(digits(out, *job, steps=40), hostname=host), tmp_path, "second")
    procs.append(other)
    code = other.wait(timeout=patience(120))
    text = other.output()
    assert code == 2, text[-3000:]
    lines = [line for line in text.splitlines() if line.startswith("ptrain: error:")]
    assert len(lines) == 1 and f"output_dir {out} is in use by" in lines[0], text[-3000:]
    assert f"process {owner['pid']} on host" in lines[0]
    if second.endswith("same-job"):
        assert "another command of the same job j19" in lines[0]
    assert in_flight.is_dir() and (in_flight / "model.safetensors").exists()  # nothing of the live job touched
    assert lock_of(out)["token"] == owner["token"] and first.p.poll() is None  # the job still runs, still owns it
    first.tree()[-1].send_signal(signal.SIGTERM)  # the trainer: preempted, saves, exits 143
    assert first.wait(timeout=patience(120)) == 143, first.output()[-3000:]
    assert not (out / LOCK_NAME).exists() and leftovers(first, other) == []


# ---- 6: two commands with the same --job_id on one output_dir ----------------------------------
@pytest.mark.parametrize("how", ["--job_id", "PADDLE_JOB_ID"])
def test_second_command_of_the_same_job_id_is_refused(tmp_path, procs, how):
    """Before: both trained from step 0 at once, both exited 0, metrics.jsonl rows of one were lost."""
    out = tmp_path / "out"
    flags = ["--job_id", "same"] if how == "--job_id" else []
    extra = {} if flags else {"PADDLE_JOB_ID": "same"}
    first = Proc(digits(out, *flags), tmp_path, "first", env=env(**extra))
    procs.append(first)
    wait_for(lambda: has_checkpoint(out), "a checkpoint", proc=first)
    owner = lock_of(out)
    second = Proc(digits(out, *flags, steps=40), tmp_path, "second", env=env(**extra))
    procs.append(second)
    code = second.wait(timeout=patience(120))
    text = second.output()
    assert code == 2, text[-3000:]
    assert (f"output_dir {out} is in use by another command of the same job same (process {first.p.pid} on host"
            in text), text[-3000:]
    assert lock_of(out)["token"] == owner["token"] and first.p.poll() is None
    first.p.send_signal(signal.SIGTERM)
    assert first.wait(timeout=patience(120)) == 143, first.output()[-3000:]
    steps = metric_steps(out)
    assert steps == sorted(set(steps)) and steps[0] == 20  # one run's rows, in order, none lost or doubled
    assert not (out / LOCK_NAME).exists() and leftovers(first, second) == []
