"""Loading batches: map-style dataset checks, per-sample seeding for workers, the in-process loader, and
``paddle.io.DataLoader`` with workers that die with the training process; the trainer's map-style loaders
(:func:`train_loader`, :func:`eval_loader`); an epoch's iterator started without
moving numpy's RNG (:func:`epoch_iterator`), its batches read with the loader's failures said in one line
(:func:`next_batch`), and closed with the epoch (:func:`epoch_of`).
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import random
import re
import signal
from collections.abc import Mapping
from typing import Optional, Tuple

import numpy as np
import paddle
from paddle.base import core
from paddle.base.framework import _current_expected_place, _current_expected_place_, _set_expected_place
from paddle.io import BatchSampler
from ..errors import DataError, WorkerKilled, option
from .batch import default_collate
from .batch_errors import load_batch
from .read_ahead import ReadAhead
from .samplers import ShardedEvalSampler
from .worker_batches import WorkerLoader, abandon_iterator


def dataset_length(dataset, role: str) -> int:
    if isinstance(dataset, paddle.io.DataLoader):
        raise DataError(f"the {role} dataset is a paddle.io.DataLoader: pass its dataset (loader.dataset) and "
                        "set the batch size, workers and collate_fn through TrainingArguments and Trainer(collate_fn=...)")
    if isinstance(dataset, paddle.io.IterableDataset):
        raise DataError(f"the {role} dataset is an IterableDataset: give a map-style dataset (with __len__ and __getitem__)")
    try:
        n = len(dataset)
    except TypeError:
        raise DataError(f"the {role} dataset has no len(): give a map-style dataset (with __len__ and __getitem__)") from None
    if n == 0:
        raise DataError(f"the {role} dataset is empty: check the data path or filters")
    return n


class SeededDataset(paddle.io.Dataset):
    """Fetches sample ``i`` of epoch ``e`` with python's and numpy's global RNGs
    seeded from ``(seed, e, i)``, so random augmentation in DataLoader workers
    does not depend on which worker fetched the sample or on where a resumed
    run started. Costs about 8 microseconds per sample (in the worker).

    A dataset with ``__getitems__(indices)`` is fetched a batch at a time
    (:func:`make_loader`), under one seed of ``(seed, e, first index of the
    batch)``: a resumed run starts at a batch boundary, so its batches and
    their draws are the uninterrupted run's.
    """

    def __init__(self, dataset, seed: int):
        self.dataset = dataset
        self.seed = seed
        self.epoch = 0
        if hasattr(dataset, "__getitems__"):  # only then: load_batch and make_loader look for it
            self.__getitems__ = self._getitems

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.dataset)

    def _seed(self, index) -> None:
        sample_seed = (self.seed * 1_000_003 + self.epoch) * 2_147_483_647 + int(index)
        random.seed(sample_seed)
        np.random.seed(sample_seed % (2 ** 32))

    def __getitem__(self, index):
        self._seed(index)
        return self.dataset[index]

    def _getitems(self, indices):
        self._seed(indices[0])
        return self.dataset.__getitems__(indices)


class InProcessLoader:
    """Batches built in this process: ``collate_fn([dataset[i] for i in batch])``,
    numpy arrays turned into tensors on the current device.

    Used instead of ``paddle.io.DataLoader`` when there are no workers: paddle
    3.3.1's single-process loader waits forever when ``__getitem__`` raises,
    while here the dataset's own exception (with its file name) reaches the
    caller at its step. With ``read_ahead`` the next batches are built in a
    thread while the step runs, as paddle's own loader does, whenever fetching
    a batch draws from no global RNG (:mod:`trainer.data.read_ahead`); a
    dataset that draws randomness is read in the calling thread exactly when
    the step needs the batch, so the RNG state saved at a step boundary
    resumes the data pipeline exactly either way.
    """

    def __init__(self, dataset, batch_sampler: BatchSampler, collate_fn=None, read_ahead: bool = False):
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.collate_fn = collate_fn or default_collate
        self.read_ahead = read_ahead

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self):
        if self.read_ahead:
            # tensors are made in the thread on CPU; on a device the copy is the training thread's
            place = _current_expected_place()
            return ReadAhead(iter(self.batch_sampler), self._fetch, to_tensors,
                             convert_in_thread=isinstance(place, core.CPUPlace),
                             thread_init=functools.partial(_set_expected_place, place))
        return self._batches()

    def _fetch(self, indices):
        return load_batch(self.dataset, indices, self.collate_fn)  # a bad sample is a DataError naming its index and field

    def _batches(self):
        for indices in self.batch_sampler:
            yield to_tensors(self._fetch(indices))


def to_tensors(value):
    """The batch with each numpy array made a paddle tensor on the current device (``paddle.to_tensor``);
    lists, tuples (as lists) and mappings are walked, anything else is left as it is."""
    if isinstance(value, np.ndarray):
        return array_to_tensor(value)
    if isinstance(value, (list, tuple)):
        return [to_tensors(v) for v in value]
    if isinstance(value, Mapping):  # dict, paddlenlp BatchEncoding (a Mapping, not a dict), ...
        return {k: to_tensors(v) for k, v in value.items()}
    return value


_NUMERIC_KINDS = frozenset("biufc")  # bool, signed, unsigned (uint16 is bfloat16 to paddle), float, complex
_CPU = core.CPUPlace()
_WRAP_DENSE = getattr(core.eager, "read_next_tensor_list", None)  # paddle's DataLoader's own; absent: to_tensor


def array_to_tensor(array: np.ndarray) -> paddle.Tensor:
    """``paddle.to_tensor(array)`` (a copy, the array's dtype, ``stop_gradient=True``), in a quarter of its time
    on CPU: a numeric array is copied into a ``DenseTensor`` and wrapped, as paddle's own ``DataLoader`` hands
    its batches to the training thread (~7 us a tensor, where ``to_tensor``'s checks and naming take ~30 us,
    twice a step). On a device, and for other dtypes, ``paddle.to_tensor`` itself."""
    place = _current_expected_place_()
    if _WRAP_DENSE is not None and array.dtype.kind in _NUMERIC_KINDS and isinstance(place, core.CPUPlace):
        dense = core.DenseTensor()
        dense.set(array, _CPU)
        return _WRAP_DENSE([dense])[0]
    return paddle.to_tensor(array)


def killed_workers(iterator) -> list:
    """``[(pid, signal number)]`` of the iterator's DataLoader workers that a signal ended (paddle's reader
    reaps a dead worker through ``is_alive()``, so its exit code is known by the time the loader fails)."""
    killed = []
    for worker in getattr(iterator, "_workers", []) or []:
        code = getattr(worker, "exitcode", None)
        if isinstance(code, int) and code < 0:
            killed.append((worker.pid, -code))
    return killed


_SIGNALLED = re.compile(r"DataLoader process \(pid (\d+)\) exited is killed by signal: ([^.(]+)")


def signalled_worker(exc: Optional[BaseException]) -> Optional[Tuple[int, int]]:
    """``(pid, signal number)`` when ``exc`` is paddle's SystemError for a DataLoader worker a
    signal ended. paddle's SIGCHLD handler raises it in the main thread wherever the step is
    (inside the optimizer, a callback, an import), not only where the next batch is fetched."""
    m = _SIGNALLED.search(str(exc)) if isinstance(exc, SystemError) else None
    if m is None:
        return None
    text = m.group(2).strip()
    for signum in signal.valid_signals():
        if signal.strsignal(signum) == text:
            return int(m.group(1)), int(signum)
    return None


def killed_worker_of(exc: BaseException) -> Optional[Tuple[int, int]]:
    """paddle's "DataLoader process (pid N) exited is killed by signal" SystemError, raised
    directly or inside a callback (CallbackError's cause): ``(pid, signal number)``, else None."""
    return signalled_worker(exc) or signalled_worker(exc.__cause__)


def worker_killed(pid: int, signum: int) -> WorkerKilled:
    name = signal.Signals(signum).name if signum in signal.valid_signals() else f"signal {signum}"
    return WorkerKilled(f"a DataLoader worker (pid {pid}) was killed by {name} while loading a batch: it "
                        "raised nothing (the OOM killer sends SIGKILL: check memory, or lower "
                        f"--dataloader_num_workers); exit {128 + signum}, which --max_restarts restarts "
                        "from the newest checkpoint", signum)


def live_children() -> set:
    """The pids of this process's live multiprocessing children (for :func:`end_cut_start`)."""
    return {p.pid for p in multiprocessing.active_children()}


def end_cut_start(exc: BaseException, before: set) -> None:
    """Clean up after ``iter(loader)`` was cut by ``exc``: paddle's SIGCHLD handler raises wherever the main thread
    is, also inside the next iterator's start while it forks its workers (seen under load at an epoch boundary,
    after a worker of the previous iterator was killed). That iterator never reaches the caller:

    - the half-built paddle iterator, still alive in the traceback's frames, gets the bounded shutdown of
      :func:`abandon_iterator` (its ``__del__`` would otherwise run at interpreter exit and wait forever for a
      queue thread that can no longer start);
    - the children it forked since ``before`` (:func:`live_children`) are SIGKILLed: paddle's workers ignore
      the SIGTERM of multiprocessing's exit handler, whose join would otherwise hang the process at exit."""
    from paddle.io.dataloader.dataloader_iter import _DataLoaderIterBase

    tb = exc.__traceback__
    while tb is not None:
        cut = tb.tb_frame.f_locals.get("self")
        if isinstance(cut, _DataLoaderIterBase) and not getattr(cut, "_shutdown", True):
            try:
                abandon_iterator(cut)
            except Exception:  # a start cut half way lacks parts paddle's shutdown expects; it is marked done
                cut._shutdown = True
        tb = tb.tb_next
    started = [p for p in multiprocessing.active_children() if p.pid not in before]
    for child in started:
        child.kill()
    for child in started:
        child.join(1)


def close_iterator(iterator) -> None:
    """End an epoch's iterator now, whether or not it ran to its end.

    The trainer stops each epoch's iterator after the epoch's last step,
    before its ``StopIteration``; paddle's multi-process iterator is then kept
    alive by its own reader thread, and its workers with it (one set leaked
    per epoch). Its workers get the same bounded shutdown as a failed
    iterator (:func:`abandon_iterator`); a generator is closed. The
    iterator's pipes go with it when paddle's reader thread, which holds it,
    ends (within its 5-second poll): no ``gc.collect()`` here, which cost
    ~80 ms of CPU per epoch in a process with paddle loaded and freed nothing
    that reference counting does not.
    """
    if hasattr(iterator, "end_pass"):  # workers: shut down, or kept when persistent (WorkerLoader)
        iterator.end_pass()
    elif hasattr(iterator, "_shutdown_on_exit"):
        abandon_iterator(iterator)
    elif hasattr(iterator, "close"):
        iterator.close()


def make_loader(dataset, batch_sampler: BatchSampler, collate_fn=None, num_workers: int = 0, read_ahead: bool = False,
                persistent_workers: bool = False):
    """An :class:`InProcessLoader` without workers (reading ahead in a thread when
    ``read_ahead``), else a ``paddle.io.DataLoader`` with
    ``num_workers`` processes (a new set per epoch, shut down by :func:`close_iterator`; with
    ``persistent_workers`` one set for every pass, shut down by :func:`shutdown_workers`),
    given whole batches and handing them over through shared-memory slots
    (:class:`trainer.data.worker_batches.WorkerLoader`). The workers ignore SIGTERM/SIGINT
    and die with the training process (``trainer.process.dataloader_worker_init``). A dataset
    with ``__getitems__`` is asked for whole batches there too, and a batch it assembled
    itself (``trainer.data.batch.AssembledBatch``) is not collated again."""
    if num_workers == 0:
        return InProcessLoader(dataset, batch_sampler, collate_fn, read_ahead=read_ahead)
    return WorkerLoader(dataset, batch_sampler, collate_fn, num_workers, persistent=persistent_workers)


def shutdown_workers(*loaders) -> None:
    """End the persistent DataLoader workers of ``loaders`` (any loader: those without are skipped)."""
    for loader in loaders:
        shutdown = getattr(loader, "shutdown", None)
        if callable(shutdown):
            shutdown()


def train_loader(trainer, collate_fn, persistent_workers: bool):
    """A map-style training set's ``(sampler, SeededDataset or None, loader)``: the run's recipe orders it
    (``trainer.recipe``: ours, or PaddleNLP's); with workers each sample is fetched under a seed of
    (seed, epoch, index), so that the workers' randomness is exact on resume."""
    a = trainer.args
    n = dataset_length(trainer.train_dataset, "training")
    sampler = trainer.recipe.train_sampler(trainer, n)
    if sampler.batches_per_epoch() == 0:
        raise DataError(f"the training dataset has {n} samples, fewer than one batch per process with "
                        f"dataloader_drop_last: lower per_device_train_batch_size or set "
                        f"{option('dataloader_drop_last', False)}")
    seeded = SeededDataset(trainer.train_dataset, a.seed) if a.dataloader_num_workers > 0 else None
    loader = make_loader(trainer.train_dataset if seeded is None else seeded, sampler, collate_fn,
                         a.dataloader_num_workers, read_ahead=a.dataloader_read_ahead,
                         persistent_workers=persistent_workers)
    return sampler, seeded, loader


def eval_loader(dataset, collate_fn, args, readers: int, rank: int, persistent_workers: bool, sampler_class=None):
    """A map-style evaluation set's loader: a contiguous, unpadded shard for each of ``readers`` data ranks (or the
    recipe's ``sampler_class``, e.g. ``InterleavedEvalSampler``; its ``gathered_order`` rides on the loader as
    ``eval_order``)."""
    n = dataset_length(dataset, "evaluation")
    if n < readers:
        raise DataError(f"the evaluation dataset has {n} samples, fewer than the {readers} processes: "
                        "give more samples or run with fewer processes")
    sampler = (sampler_class or ShardedEvalSampler)(n, args.per_device_eval_batch_size, readers, rank)
    loader = make_loader(dataset, sampler, collate_fn, args.dataloader_num_workers, read_ahead=args.dataloader_read_ahead,
                         persistent_workers=persistent_workers)
    order = getattr(sampler, "gathered_order", None)
    loader.eval_order = order() if order is not None and readers > 1 else None
    return loader


def epoch_iterator(loader):
    """``iter(loader)`` without moving numpy's global RNG. paddle's multi-process iterator draws its
    workers' base seed from it (``np.random.randint``) once per epoch, and a resumed run creates one
    iterator more than the uninterrupted run, which would shift every later numpy draw. The base seed
    is unused here: SeededDataset seeds each sample from (seed, epoch, index)."""
    saved, before = np.random.get_state(), live_children()
    try:
        return iter(loader)
    except BaseException as exc:  # e.g. a dead worker's signal inside the start of this iterator: no one has it
        end_cut_start(exc, before)
        raise
    finally:
        np.random.set_state(saved)


def next_batch(batches):
    """``next(batches)`` in a training epoch: a loader that runs dry before the epoch's last step, or whose
    worker raised or was killed, is a :class:`DataError` or :class:`WorkerKilled` of one line."""
    try:
        return next(batches)
    except StopIteration:
        raise DataError("the training dataloader ran out of batches before the epoch's last step: "
                        "a custom get_train_dataloader must yield the sampler's batches") from None
    except SystemError as exc:  # paddle's multi-process loader hides the worker's exception behind this
        if "Blocking queue is killed" not in str(exc):
            raise
        killed = killed_workers(batches)  # before abandon_iterator, which SIGKILLs what is left
        abandon_iterator(batches)
        if killed:
            raise worker_killed(*killed[0]) from None
        raise DataError("a DataLoader worker raised while loading a batch (its error is printed above); "
                        f"run with {option('dataloader_num_workers', 0)} to get that error raised here") from None


@contextlib.contextmanager
def epoch_of(batches):
    """An epoch over ``batches``: its DataLoader workers end with it, or with a stop or a failure; a worker a signal
    killed (paddle's SIGCHLD handler raises a SystemError wherever the main thread is) is a :class:`WorkerKilled`."""
    try:
        try:
            yield batches
        finally:
            close_iterator(batches)
    except Exception as exc:
        killed = killed_worker_of(exc)
        if killed is None:
            raise
        abandon_iterator(batches)
        raise worker_killed(*killed) from None
