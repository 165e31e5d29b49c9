"""How batches come from DataLoader workers: fetched a batch at a time, handed over through shared-memory slots.

``make_loader`` with workers builds a :class:`WorkerLoader`: paddle's ``DataLoader`` (its worker
processes, their shutdown and failure reporting), given whole batches to fetch. Each sampler batch
reaches a worker as one item ``(slot, indices)`` (:class:`OneFetchPerBatch`); the worker fetches it
with one ``__getitems__(indices)`` call when the dataset has one (paddle 3.3's fetcher calls
``dataset[i]`` once per index), else sample by sample (:class:`BatchFetches`), collates it
(:class:`CollateFetched`) and hands it over through the slot.

Why slots: paddle 3.3.1's worker moves every array of a batch through a new shared-memory segment of
its own. It copies the array into a new ``DenseTensor`` (the pages of a fresh allocation fault in),
copies that into a new ``/dev/shm`` file (``_share_filename``), and the training process maps the file
and faults its pages in again. Measured here: about 12 ms of CPU for a 4.8 MB batch of 32 uint8
images of 224 x 224, 0.39 ms per image, a quarter of what decoding the image costs. Instead:

1. the loader maps one anonymous shared region before its workers fork, cut into slots
   (:class:`BatchSlots`), and the training process gives each batch a free slot along with its
   indices (:meth:`BatchSlots.acquire`);
2. the worker writes the batch into it (:class:`SlotWriter`): a dataset that assembles its batch
   asks for its arrays with ``trainer.data.batch.batch_array`` and writes them in place; any other
   array of 64 KiB or more (images, token ids) is copied in, one ``memcpy``. The worker sends only
   where they are (:class:`SlotRef`);
3. the training process copies them out into tensors on the current device and frees the slot
   (:meth:`BatchSlots.take`): on the CPU into a numpy array of its own, which the tensor then owns
   (DLPack), so a batch never changes under a step or a callback that keeps it.

Small arrays (labels) still go paddle's way, which needs at least one tensor per batch anyway: pickled
through paddle's queue (``use_shared_memory=False``: a new ``/dev/shm`` file for 256 bytes of labels
costs more than the pickle), and so does a whole batch when no slot is free or it does not fit in one
(``SLOT_BYTES``). Each worker has a
pool of ``prefetch_factor + 1`` slots (its batches in flight, plus the one being taken out), so one is
free while batches are taken in order. A slot is address space only (``MAP_NORESERVE``): the pages a
batch touches take memory, and stay until the loader goes. The region has no name: nothing is left in
``/dev/shm`` when a process is killed, it goes with the last process that maps it. Needs the ``fork``
start method (Linux's default through Python 3.13); with another one the loader is paddle's alone.
"""


from __future__ import annotations

import collections
import functools
import mmap
import multiprocessing
import os
from collections.abc import Mapping
from typing import Optional, Tuple

import numpy as np
import paddle
from paddle.io import BatchSampler, DataLoader

from ..process import dataloader_worker_init
from .batch import batch_memory, default_collate

SLOT_BYTES = 256 << 20  #: address space per slot; a larger batch goes paddle's way
MIN_BYTES = 64 << 10  #: smaller arrays go paddle's way
_ALIGN = 64
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux's value; Python's mmap does not name it


def slots_supported() -> bool:
    """Whether the workers inherit the region: they must be forked (``multiprocessing``'s start method)."""
    method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    return hasattr(mmap, "MAP_SHARED") and method == "fork"  # (without fixing the start method: no side effect)


class SlotRef:
    """Where a worker put an array: byte ``offset`` in the region, ``shape`` and ``dtype`` (picklable, tiny)."""

    __slots__ = ("offset", "shape", "dtype")

    def __init__(self, offset: int, shape, dtype: str):
        self.offset, self.shape, self.dtype = offset, tuple(shape), dtype

    def __reduce__(self):
        return SlotRef, (self.offset, self.shape, self.dtype)


class BatchSlots:
    """``count`` slots of ``slot_bytes`` in one anonymous shared mapping, made before the workers fork.

    The training process hands slots out (:meth:`acquire`, in the order the batches are sent) and takes
    each batch back in the same order (:meth:`take`, which frees its slot); a worker writes the batch into
    the slot it was given (:meth:`writer`)."""

    def __init__(self, count: int, slot_bytes: Optional[int] = None, pools: int = 1):
        self.count, self.slot_bytes = int(count), int(SLOT_BYTES if slot_bytes is None else slot_bytes)
        self.pools = max(1, min(int(pools), self.count))
        self._region = mmap.mmap(-1, self.count * self.slot_bytes, flags=mmap.MAP_SHARED | _MAP_NORESERVE)
        self.reset()

    def reset(self) -> None:
        """All slots free (a new epoch's iterator, the previous one's workers gone)."""
        self.handed_over = 0  # arrays this iterator took out of a slot (the others came paddle's way)
        self._free = [collections.deque(range(p, self.count, self.pools)) for p in range(self.pools)]
        self._sent = collections.deque()  # the slot of each batch sent and not yet taken, in order
        self._sent_total = 0

    def acquire(self) -> Optional[int]:
        """A free slot for the next batch sent to a worker, None when all are in use (it goes paddle's way).

        Batch ``k`` takes a slot of pool ``k % pools``: paddle hands batches to its workers in turn, so each
        worker writes into its own few slots, and a new epoch's worker maps fewer pages (each page a new
        process first writes costs a fault, about 3 us here)."""
        pool = self._sent_total % self.pools
        self._sent_total += 1
        free = self._free[pool] or next((f for f in self._free if f), None)
        slot = free.popleft() if free else None
        self._sent.append(slot)
        return slot

    # ---- in the worker ----------------------------------------------------------
    def writer(self, slot: Optional[int]) -> Optional["SlotWriter"]:
        """The worker's writes into ``slot`` (None: no slot, the batch goes paddle's way)."""
        if slot is None:
            return None
        return SlotWriter(self._region, slot * self.slot_bytes, (slot + 1) * self.slot_bytes)

    # ---- in the training process ------------------------------------------------
    def take(self, batch):
        """The next batch (paddle's iterator's output) with its :class:`SlotRef` s turned into tensors on
        the current device; frees its slot."""
        slot = self._sent.popleft() if self._sent else None
        try:
            return self._tensors(batch, paddle.get_device() == "cpu")
        finally:
            if slot is not None:
                self._free[slot % self.pools].append(slot)

    def _tensors(self, value, cpu: bool):
        if isinstance(value, SlotRef):
            size = int(np.prod(value.shape, dtype=np.int64))
            host = np.frombuffer(self._region, np.dtype(value.dtype), size, value.offset).reshape(value.shape)
            self.handed_over += 1
            if cpu:  # a copy of its own (the slot is reused), handed over without another copy
                return paddle.utils.dlpack.from_dlpack(host.copy())
            return paddle.to_tensor(host)  # straight from the slot to the device
        if isinstance(value, list):
            return [self._tensors(v, cpu) for v in value]
        if type(value) is tuple:
            return tuple(self._tensors(v, cpu) for v in value)
        if isinstance(value, dict):
            return {k: self._tensors(v, cpu) for k, v in value.items()}
        return value


class SlotWriter:
    """A worker's writes into one slot (bytes ``start`` to ``end`` of the region): arrays a dataset asks
    for while it builds the batch (:meth:`array`, through ``trainer.data.batch.batch_array``), then the
    collated batch's large arrays put there (:meth:`put`), copied unless they are those arrays already."""

    def __init__(self, region, start: int, end: int):
        self._region, self._offset, self._end = region, start, end
        self._carved = {}  # data address -> (offset, bytes) of the arrays handed out by array()

    def _room(self, nbytes: int, dtype: np.dtype) -> bool:
        return nbytes >= MIN_BYTES and self._offset + nbytes <= self._end and not dtype.hasobject

    def _view(self, shape, dtype: np.dtype) -> Tuple[np.ndarray, int]:
        offset, size = self._offset, int(np.prod(shape, dtype=np.int64))
        self._offset += -(-size * dtype.itemsize // _ALIGN) * _ALIGN
        return np.frombuffer(self._region, dtype, size, offset).reshape(shape), offset

    def array(self, shape, dtype) -> Optional[np.ndarray]:
        """An uninitialized array in the slot, None when it is small or does not fit (then ``np.empty``)."""
        dtype = np.dtype(dtype)
        if not self._room(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, dtype):
            return None
        array, offset = self._view(tuple(shape), dtype)
        self._carved[array.__array_interface__["data"][0]] = (offset, array.nbytes)
        return array

    def put(self, value):
        """``value`` (the collated batch) with each ndarray of ``MIN_BYTES`` or more in the slot replaced by
        its :class:`SlotRef` (lists, tuples and mappings walked; what does not fit stays as it is)."""
        if isinstance(value, np.ndarray):
            carved = self._carved.get(value.__array_interface__["data"][0]) if value.flags.c_contiguous else None
            if carved is not None and value.nbytes <= carved[1]:  # written in place by the dataset
                return SlotRef(carved[0], value.shape, value.dtype.str)
            if not self._room(value.nbytes, value.dtype):
                return value
            target, offset = self._view(value.shape, value.dtype)
            np.copyto(target, value)
            return SlotRef(offset, value.shape, value.dtype.str)
        if isinstance(value, list):
            return [self.put(v) for v in value]
        if type(value) is tuple:
            return tuple(self.put(v) for v in value)
        if isinstance(value, Mapping):
            return {k: self.put(v) for k, v in value.items()}
        return value


class SlotBox:
    """The :class:`BatchSlots` of a loader's current iterator: read by its sampler and, through the fork,
    by its workers. ``count`` 0: no slots (not forked workers)."""

    def __init__(self, count: int, pools: int = 1):
        self.count, self.pools = count, pools
        self.slots: Optional[BatchSlots] = None

    def renew(self, previous_alive: bool) -> BatchSlots:
        """Slots for a new iterator: the same region, all free, once the previous iterator's workers are
        gone; a new region while they may still write into the old one."""
        if self.slots is None or previous_alive:
            self.slots = BatchSlots(self.count, pools=self.pools)
        else:
            self.slots.reset()
        return self.slots


class SlotIterator:
    """paddle's multi-process iterator, each batch taken out of its slot. Anything else (``_workers``,
    ``_shutdown_on_exit``: ``trainer.data.loader``'s shutdown and killed-worker checks) is paddle's.
    ``keep``: the iterator of persistent workers, kept by :meth:`end_pass` when its pass was read to its end."""

    def __init__(self, iterator, slots: Optional[BatchSlots], keep: bool = False):
        self._iterator, self._slots, self._keep = iterator, slots, keep

    def end_pass(self) -> None:
        """The pass (an epoch, an evaluation) is over, read to its end or not: the workers are shut down
        (:func:`abandon_iterator`), unless they are persistent and nothing is in flight (then the next
        pass reuses them, :func:`restart`)."""
        if not (self._keep and drained(self._iterator)):
            abandon_iterator(self._iterator)

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self._iterator)
        return batch if self._slots is None else self._slots.take(batch)

    def __getattr__(self, name):
        return getattr(self._iterator, name)


# ---- what paddle's workers are given -------------------------------------------------
class BatchFetches(paddle.io.Dataset):
    """The dataset as paddle's workers see it: item ``(slot, indices)`` is ``(the slot's SlotWriter or None,
    the batch's samples)``, fetched in one ``__getitems__(indices)`` call when the dataset has one (its
    ``trainer.data.batch.batch_array`` s then lie in the slot), else one by one."""

    def __init__(self, dataset, box: "SlotBox"):
        self.dataset, self.box = dataset, box
        self._batched = hasattr(dataset, "__getitems__")
        self._epochs = hasattr(dataset, "set_epoch") and hasattr(dataset, "epoch")

    def __len__(self) -> int:
        return len(self.dataset)

    def epoch_of(self) -> Optional[int]:
        """The dataset's epoch in the training process (sent with each batch), None when it has none."""
        return self.dataset.epoch if self._epochs else None

    def __getitem__(self, item):
        slot, indices, epoch = item
        if epoch is not None and epoch != self.dataset.epoch:  # a persistent worker, forked in an earlier epoch
            self.dataset.set_epoch(epoch)
        writer = self.box.slots.writer(slot) if self.box.slots is not None else None
        if not self._batched:
            return writer, [self.dataset[i] for i in indices]
        with batch_memory(writer):
            return writer, self.dataset.__getitems__(list(indices))


class OneFetchPerBatch(BatchSampler):
    """``batch_sampler``'s batches, each as a one-item batch ``[(slot, indices, epoch)]`` for
    :class:`BatchFetches`, with a slot of the current iterator's :class:`BatchSlots` (None without slots)
    and the dataset's epoch when the pass began (``epoch_of()``)."""

    def __init__(self, batch_sampler, box: "SlotBox", epoch_of=lambda: None):
        self.batch_sampler, self.box, self.epoch_of = batch_sampler, box, epoch_of

    def __iter__(self):
        slots = self.box.slots  # this iterator's, bound now: the next iterator may get a new region
        epoch = self.epoch_of()
        for indices in self.batch_sampler:
            yield [(slots.acquire() if slots is not None else None, tuple(int(i) for i in indices), epoch)]

    def __len__(self) -> int:
        return len(self.batch_sampler)


class CollateFetched:
    """In the worker: ``collate_fn`` of a :class:`BatchFetches` item's samples, its large arrays put into the
    item's slot (:meth:`SlotWriter.put`)."""

    def __init__(self, collate_fn):
        self.collate_fn = collate_fn or default_collate

    def __call__(self, fetched):
        writer, samples = fetched[0]
        batch = self.collate_fn(samples)
        return batch if writer is None else writer.put(batch)


def abandon_iterator(iterator) -> None:
    """Stop a failed ``paddle.io.DataLoader`` iterator's workers without waiting forever.

    paddle 3.3.1's multi-process iterator joins its workers with no timeout in
    ``__del__``; after a worker raised, that join can block the process for
    good (seen here: garbage collection of the failed iterator hung). Shut it
    down with paddle's own 1-second-per-worker exit path, then kill what is
    still alive. Reaches into paddle's iterator on purpose: there is no public
    API for this.
    """
    shutdown = getattr(iterator, "_shutdown_on_exit", None)
    if shutdown is None:
        return
    try:
        shutdown()
    finally:
        for worker in getattr(iterator, "_workers", []):
            if worker.is_alive():  # e.g. blocked in __getitem__; workers ignore SIGTERM, so SIGKILL
                worker.kill()
                worker.join(1)


def drained(iterator) -> bool:
    """Whether paddle's persistent-workers iterator can start another pass as it is: not shut down, its
    reader thread and workers alive, no batch in flight or waiting (the pass was read to its end)."""
    try:
        return (not iterator._shutdown and iterator._batches_outstanding == 0 and not iterator._structure_infos
                and iterator._blocking_queue.size() == 0 and iterator._thread.is_alive()
                and all(w.is_alive() for w in iterator._workers))
    except AttributeError:  # another paddle's iterator: never reused
        return False


def restart(iterator) -> None:
    """Start the next pass of a :func:`drained` persistent iterator: its counters back to 0, a new pass
    of its batch sampler, the first batches sent. paddle's own ``_reset`` does this after a handshake
    with every worker that it polls every 0.5 s (a lost half second a pass, ~2 s an epoch with an
    evaluation); with nothing in flight there is nothing for the handshake to flush."""
    with iterator._thread_lock:
        iterator._send_idx = iterator._rcvd_idx = iterator._batches_outstanding = 0
        iterator._task_infos, iterator._structure_infos = {}, []
        iterator._worker_status = [True] * iterator._num_workers
        iterator._sampler_iter = iter(iterator._index_sampler)
    for _ in range(iterator._outstanding_capacity):
        iterator._try_put_indices()


class WorkerLoader:
    """``paddle.io.DataLoader`` with ``num_workers`` processes, fed whole batches, its batches handed
    over through slots (:class:`BatchSlots`, the module docstring). The workers ignore SIGTERM/SIGINT
    and die with the training process (``trainer.process.dataloader_worker_init``).

    A new set of workers per iterator, shut down by ``trainer.data.loader.close_iterator``; with
    ``persistent`` one set for every pass read to its end (:meth:`SlotIterator.end_pass`), shut down
    by :meth:`shutdown` (the trainer's, at the end of fit()). A dataset with ``set_epoch`` and ``epoch``
    (``SeededDataset``) has its epoch sent along with each batch: a persistent worker forked in an
    earlier epoch fetches the batch under the epoch the training process is in."""

    def __init__(self, dataset, batch_sampler: BatchSampler, collate_fn=None, num_workers: int = 1,
                 persistent: bool = False):
        prefetch = 2  # paddle's default prefetch_factor: prefetch x workers batches in flight
        # a pool of prefetch + 1 slots per worker: its batches in flight and the one being taken out
        slots = slots_supported()
        self.box = SlotBox((prefetch + 1) * num_workers if slots else 0, pools=num_workers)
        self.batch_sampler = batch_sampler
        self.persistent = bool(persistent)
        self._live: Optional[SlotIterator] = None  # persistent: the iterator whose workers are kept
        fetches = BatchFetches(dataset, self.box)
        self.loader = DataLoader(fetches, batch_sampler=OneFetchPerBatch(batch_sampler, self.box, fetches.epoch_of),
                                 collate_fn=CollateFetched(collate_fn), num_workers=num_workers,
                                 prefetch_factor=prefetch, return_list=True, persistent_workers=self.persistent,
                                 use_shared_memory=not slots,  # what is left (labels) is small: pickled
                                 worker_init_fn=functools.partial(dataloader_worker_init, parent_pid=os.getpid()))
        self._previous_workers: list = []  # the last iterator's processes (not the iterator: its pipes may go)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> "SlotIterator":
        live = self._live
        if live is not None and drained(live._iterator):  # the persistent workers, idle: the next pass
            if live._slots is not None:
                live._slots.reset()  # before restart() hands out the first slots
            restart(live._iterator)
            return live
        self.shutdown()
        alive = any(w.is_alive() for w in self._previous_workers)
        slots = self.box.renew(alive) if self.box.count else None
        iterator = iter(self.loader)  # forks the workers: they see box.slots as it is now
        self._previous_workers = list(getattr(iterator, "_workers", []) or [])
        made = SlotIterator(iterator, slots, keep=self.persistent)
        if self.persistent:
            self._live = made
        return made

    def shutdown(self) -> None:
        """End the persistent workers now (nothing without them); the next iterator starts a new set."""
        live, self._live = self._live, None
        if live is not None:
            abandon_iterator(live._iterator)
            self.loader._iterator = None  # paddle's DataLoader keeps its persistent iterator here
