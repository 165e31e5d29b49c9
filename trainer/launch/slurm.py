"""Slurm: a job stopped by SIGUSR1 requeues itself, as Lightning's SLURM environment does.

``ptrain`` (the top-level command, never one of its ranks) that ends with 138 (preempted by SIGUSR1: every
rank saved the agreed step) inside a Slurm job (``SLURM_JOB_ID``) runs ``scontrol requeue`` for that job
(``<array job>_<task>`` for an array task), once, from task 0 of the step: the requeued job resumes with
``--resume_from_checkpoint auto``, and the batch script needs no trap and no ``scontrol`` line of its own.
``PTRAIN_SLURM_REQUEUE=0`` turns this off (a script that requeues, or not, itself). Which ``--signal`` form
reaches which process is in docs/how-to/preemption.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from ..process import REQUEUE_EXIT

REQUEUE_ENV = "PTRAIN_SLURM_REQUEUE"   # "0": never requeue from ptrain


def slurm_job() -> str:
    """The Slurm job this process runs in, as ``scontrol`` names it ("" outside Slurm)."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID", "")


def requeue_if_preempted(code: int) -> None:
    """After a 138 in a Slurm job: ``scontrol requeue`` it (once, from ptrain itself on task 0)."""
    job = slurm_job()
    if code != REQUEUE_EXIT or not job or os.environ.get(REQUEUE_ENV, "1") == "0":
        return
    if "PADDLE_TRAINER_ID" in os.environ or os.environ.get("SLURM_PROCID", "0") != "0":
        return  # a rank of ptrain's launcher, or another task of the step: task 0's ptrain requeues
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        print(f"ptrain: exit {REQUEUE_EXIT} in Slurm job {job}, but scontrol is not on PATH: requeue the job "
              f"yourself (scontrol requeue {job})", file=sys.stderr)
        return
    # said first: the requeue ends this job's processes, this one among them, as soon as Slurm acts on it
    print(f"ptrain: requeueing Slurm job {job} (scontrol requeue {job}): it resumes from the checkpoint just saved",
          file=sys.stderr, flush=True)
    try:
        done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"ptrain: scontrol requeue {job} failed ({exc}): requeue the job yourself", file=sys.stderr)
        return
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        print(f"ptrain: scontrol requeue {job} failed ({why[-1] if why else f'exit {done.returncode}'}): was the "
              f"job submitted with --requeue? Requeue it yourself", file=sys.stderr)
