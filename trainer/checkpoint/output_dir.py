"""Who owns an output_dir, and whose checkpoints it holds.

A run claims its output_dir before any work (:func:`claim`): the run lock
(``trainer.checkpoint.lock``), then the reuse rule:

- a fresh run (no ``resume_from_checkpoint``) into an output_dir that holds
  another run's checkpoints is refused with one line, unless
  ``overwrite_output_dir``: then ``checkpoints/`` is first renamed to
  ``.checkpoints-overwritten-<id>`` (one atomic step: from then on no old
  checkpoint can be resumed or rotated), then deleted; a kill during the delete
  leaves only the hidden directory, which the next claim removes;
- ``results.json`` (the summary ``ptrain run`` writes when a run completes) is
  removed once a claim is accepted, fresh or resumed (a refused command leaves
  it): it describes a finished run, and this one has not finished; it is
  written again only when this run completes (a run stopped by a signal or an
  error leaves none);
- each run has a run id (``state.run_id``), recorded in every checkpoint's
  manifest; a resumed run continues the run id of the checkpoint it resumed,
  so rotation and ``auto`` only ever see the current run's checkpoints.

``ptrain run`` claims for the whole command (:func:`claim_for_command`);
``Trainer.fit()`` claims again on rank 0, which shares the lock of its own job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from typing import Iterator, Optional

from ..errors import ConfigError, option
from . import fence
from .lock import RunLock, hold_for_command, job_key
from .manifest import checkpoint_run_id, checkpoints_dir
from .store import list_checkpoints
from .writer import remove_stale_temporaries

logger = logging.getLogger("trainer.output_dir")
OVERWRITTEN = ".checkpoints-overwritten-"
RESULTS_FILE = "results.json"   # written by ptrain run when a run completes


class Claim:
    """What :func:`claim` returns: the lock (None off rank 0) and the run id of a fresh run."""

    def __init__(self, lock: Optional[RunLock], run_id: str = ""):
        self.lock = lock
        self.run_id = run_id or (lock.run_id if lock is not None else "")

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


def claim(args, is_main_process: bool, resume: Optional[str], continuing: str = "") -> Claim:
    """Lock ``args.output_dir`` (rank 0) and apply the reuse rule; the other ranks touch nothing.

    ``continuing``: the run id of a trainer whose earlier fit() this one continues (its checkpoints
    are its own).
    """
    if not is_main_process:
        return Claim(None, continuing)
    lock = RunLock(args.output_dir).acquire(take_over_same_job=True)
    try:
        check_reuse(args.output_dir, continuing or lock.run_id, resume, args.overwrite_output_dir)
    except BaseException:
        lock.release()
        raise
    return Claim(lock, continuing)


def earlier_run(output_dir: str, run_id: str, resume: Optional[str]) -> list:
    """The checkpoints of another run that a fresh run in ``output_dir`` would meet (none when it resumes: it
    continues the run it resumes; auto: the run ``latest`` names), newest first. Reads only."""
    return [] if resume else [p for p in list_checkpoints(output_dir) if checkpoint_run_id(p) != run_id]


def reuse_refusal(output_dir: str, others: list) -> ConfigError:
    newest = os.path.basename(others[0])
    return ConfigError(f"output_dir {output_dir} holds checkpoints of an earlier run (newest {newest}): continue "
                       f"it with {option('resume_from_checkpoint', 'auto')}, start afresh with "
                       f"{option('overwrite_output_dir', True)}, or use another {option('output_dir')}")


def check_reuse(output_dir: str, run_id: str, resume: Optional[str], overwrite: bool) -> None:
    """Refuse (or, with ``overwrite``, clear) another run's checkpoints before a fresh run starts; then remove
    the results.json of a finished run (this one has not finished)."""
    root = checkpoints_dir(output_dir)
    _remove_overwritten(output_dir)
    remove_stale_temporaries(root)
    others = earlier_run(output_dir, run_id, resume)
    if others and not overwrite:
        raise reuse_refusal(output_dir, others)
    if others:
        aside = os.path.join(output_dir, OVERWRITTEN + (run_id or str(os.getpid())))
        try:
            with fence.fenced(output_dir):
                os.rename(root, aside)
        except OSError as exc:
            raise ConfigError(f"overwrite_output_dir: cannot move {root} aside ({exc.strerror}): fix its permissions "
                              f"or use another {option('output_dir')}") from None
        logger.warning("overwrite_output_dir: removing %d checkpoint(s) of an earlier run from %s", len(others),
                       output_dir)
        shutil.rmtree(aside, ignore_errors=True)
    with fence.fenced(output_dir), contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(output_dir, RESULTS_FILE))  # a finished run's summary: this run has not finished


def _remove_overwritten(output_dir: str) -> None:
    """Finish deleting checkpoints an overwrite moved aside before it was killed."""
    with contextlib.suppress(OSError):
        for name in os.listdir(output_dir):
            if name.startswith(OVERWRITTEN):
                shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)


def _multinode(ns) -> bool:
    """Whether this command is one node of a multi-node job (its other nodes share the lock)."""
    nnodes = str(getattr(ns, "nnodes", None) or "1").split(":")[-1]
    ips = getattr(ns, "ips", None) or ""
    return bool(getattr(ns, "master", None)) or "," in ips or (nnodes.isdigit() and int(nnodes) > 1)


@contextlib.contextmanager
def claim_for_command(args, ns) -> Iterator[None]:
    """``ptrain run``: hold output_dir from here to the command's last line (not in a launched rank,
    whose job's ptrain already holds it, nor a rank of a raw launcher, whose rank 0 claims in fit())."""
    if "PADDLE_TRAINER_ID" in os.environ:
        yield
        return
    job = job_key(getattr(ns, "job_id", None), getattr(ns, "master", None), getattr(ns, "ips", None))
    with hold_for_command(args.output_dir, job, multinode=_multinode(ns)) as lock:
        check_reuse(args.output_dir, lock.run_id, args.resume_from_checkpoint, args.overwrite_output_dir)
        yield
