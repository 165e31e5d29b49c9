"""Batches from real DataLoader worker processes through shared-memory slots: the same batches as without
workers, kept batches never overwritten, paddle's way when a batch does not fit, a fresh region for an
iterator whose predecessor's workers still run, and a killed worker still WorkerKilled with none left."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import paddle
import psutil
import pytest
from patience import patience

from callbacks import Callback
from trainer import Trainer, TrainingArguments
from trainer.data import ResumableDistributedBatchSampler, close_iterator, make_loader
from trainer.data import worker_batches
from trainer.data.batch import AssembledBatch, batch_array, batch_memory, default_collate
from trainer.errors import WorkerKilled


class Images(paddle.io.Dataset):
    """Sample i: a (3, 96, 96) uint8 image (27 KiB; a batch of 4 is 108 KiB, slot-sized) and a float vector,
    both functions of i, and its label."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        image = ((np.arange(3 * 96 * 96) * 7 + i * 13) % 251).astype("uint8").reshape(3, 96, 96)
        return {"pixels": image, "extra": np.full(20000, i, "float32"), "label": np.int64(i % 5)}


class AssembledImages(Images):
    """Builds its batch in place: the pixels in a batch_array (in a worker: the batch's slot)."""

    def __getitems__(self, indices):
        samples = [self[i] for i in indices]
        pixels = batch_array((len(indices), 3, 96, 96), "uint8")
        for k, sample in enumerate(samples):
            pixels[k] = sample["pixels"]
        batch = default_collate(samples)
        batch["pixels"] = pixels
        return AssembledBatch(samples, batch)


def run(loader, shm_files=None):
    """The batches as numpy, and the iterator; ``shm_files`` gets the /dev/shm files of its workers seen
    after each batch (paddle names them paddle_<pid>_...)."""
    it = iter(loader)
    pids = [str(w.pid) for w in getattr(it, "_workers", [])]
    got = []
    try:
        for batch in it:
            got.append({k: np.array(v) for k, v in batch.items()})
            if shm_files is not None:
                shm_files += [f for f in os.listdir("/dev/shm") if any(f.startswith(f"paddle_{p}_") for p in pids)]
        return got, it
    finally:
        close_iterator(it)


def sampler(dataset, epoch=0):
    s = ResumableDistributedBatchSampler(len(dataset), 4, shuffle=True, seed=3, drop_last=True)
    s.set_epoch(epoch)
    return s


def assert_same(got, want):
    assert len(got) == len(want) == 10
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


@pytest.mark.timeout(180)
@pytest.mark.parametrize("dataset", [Images(), AssembledImages()], ids=["one-by-one", "getitems"])
def test_two_workers_hand_over_the_batches_of_the_in_process_loader_through_slots(dataset):
    want, _ = run(make_loader(dataset, sampler(dataset), None, 0))
    loader = make_loader(dataset, sampler(dataset), None, 2)
    assert isinstance(loader, worker_batches.WorkerLoader)
    for epoch in range(2):  # the second epoch reuses the region (the first epoch's workers are gone)
        shm_files = []
        got, it = run(loader, shm_files)
        assert_same(got, want)
        assert shm_files == []  # nothing goes through /dev/shm (Docker's 64 MB default is no limit here)
        assert it._slots is loader.box.slots and it._slots.handed_over == 20  # pixels and extra; labels paddle's way
        assert batch_is_a_tensor_of_its_own(loader)


def batch_is_a_tensor_of_its_own(loader) -> bool:
    it = iter(loader)
    try:
        first = next(it)
        return isinstance(first["pixels"], paddle.Tensor) and first["pixels"].place.is_cpu_place()
    finally:
        close_iterator(it)


@pytest.mark.timeout(180)
def test_batches_kept_while_the_workers_go_on_are_never_overwritten():
    dataset = Images()
    want, _ = run(make_loader(dataset, sampler(dataset), None, 0))
    loader = make_loader(dataset, sampler(dataset), None, 2)
    it = iter(loader)
    try:
        kept = list(it)  # 10 batches held, 6 slots: slots reused under kept batches
    finally:
        close_iterator(it)
    time.sleep(0.2)
    assert it._slots.count == 6 and it._slots.handed_over == 20
    assert_same([{k: np.array(v) for k, v in b.items()} for b in kept], want)


@pytest.mark.timeout(180)
def test_a_batch_larger_than_a_slot_goes_paddles_way(monkeypatch):
    monkeypatch.setattr(worker_batches, "SLOT_BYTES", 100 << 10)  # pixels (108 KiB) do not fit, extra (312 KiB) neither
    dataset = Images()
    want, _ = run(make_loader(dataset, sampler(dataset), None, 0))
    got, it = run(make_loader(dataset, sampler(dataset), None, 2))
    assert_same(got, want)
    assert it._slots.handed_over == 0


@pytest.mark.timeout(180)
def test_without_the_fork_start_method_the_loader_is_paddles_alone(monkeypatch):
    import multiprocessing

    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "spawn")
    dataset = AssembledImages()
    want, _ = run(make_loader(dataset, sampler(dataset), None, 0))
    loader = make_loader(dataset, sampler(dataset), None, 2)
    assert loader.box.count == 0 and loader.loader.use_shared_memory  # paddle's own /dev/shm hand-over
    got, it = run(loader)
    assert_same(got, want)
    assert it._slots is None


@pytest.mark.timeout(180)
def test_an_iterator_made_while_the_previous_ones_workers_run_gets_a_region_of_its_own():
    dataset = Images()
    want, _ = run(make_loader(dataset, sampler(dataset), None, 0))
    loader = make_loader(dataset, sampler(dataset), None, 2)
    first = iter(loader)
    second = iter(loader)
    try:
        assert first._slots is not second._slots
        got_first, got_second = [], []
        for a, b in zip(first, second):  # both sets of workers write at once
            got_first.append({k: np.array(v) for k, v in a.items()})
            got_second.append({k: np.array(v) for k, v in b.items()})
    finally:
        close_iterator(first)
        close_iterator(second)
    assert_same(got_first, want)
    assert_same(got_second, want)


@pytest.mark.parametrize("device", ["cpu", "gpu:0"])
def test_a_batch_array_lies_in_the_slot_and_is_handed_over_without_a_copy(monkeypatch, device):
    """On a GPU the batch goes from the slot to the card (paddle.to_tensor; here, without one, the copy
    lands on the CPU): that branch runs too, and a reused slot never changes a batch taken before."""
    monkeypatch.setattr(paddle, "get_device", lambda: device)
    slots = worker_batches.BatchSlots(2, slot_bytes=1 << 20)
    assert slots.acquire() == 0
    writer = slots.writer(0)
    with batch_memory(writer):
        pixels = batch_array((4, 3, 96, 96), "uint8")
        small = batch_array((4,), "int64")  # under MIN_BYTES: np.empty
    outside = batch_array((4, 3, 96, 96), "uint8")
    pixels[...] = 7
    extra = np.full((4, 20000), 2.5, "float32")
    sent = writer.put({"pixels": pixels, "extra": extra, "small": small})
    assert isinstance(sent["pixels"], worker_batches.SlotRef) and sent["pixels"].offset == 0  # in place: first
    assert isinstance(sent["extra"], worker_batches.SlotRef) and sent["extra"].offset >= pixels.nbytes  # copied after
    assert sent["small"] is small and outside.base is None and pixels.base is not None  # np.empty outside a worker
    pixels[0, 0, 0, 0] = 9  # written after put: the slot is the array itself
    got = slots.take(sent)
    assert isinstance(got["pixels"], paddle.Tensor) and np.array(got["pixels"])[0, 0, 0, 0] == 9
    assert (np.array(got["pixels"]).ravel()[1:] == 7).all() and (np.array(got["extra"]) == 2.5).all()
    assert slots.handed_over == 2 and [slots.acquire(), slots.acquire(), slots.acquire()] == [1, 0, None]  # 0 free again
    pixels[...] = 0  # the slot reused by the next batch: the tensor taken before keeps its pixels
    assert np.array(got["pixels"])[0, 0, 0, 0] == 9 and (np.array(got["pixels"]).ravel()[1:] == 7).all()


class Wide(paddle.io.Dataset):
    """Samples of 16384 float32 (64 KiB): batches of 8 go through the slots."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        return np.full([16384], i % 7, dtype="float32"), np.int64(i % 2)


class KillAWorker(Callback):
    def on_step_end(self, trainer):
        if trainer.state.global_step == 3:
            workers = [p for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE]
            os.kill(workers[0].pid, signal.SIGKILL)
            time.sleep(1.0)  # paddle's SIGCHLD handler raises here or at the next batch


@pytest.mark.timeout(180)
def test_a_worker_killed_while_batches_come_through_slots_is_worker_killed_and_none_is_left(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=30,
                             dataloader_num_workers=2, report_to=[], save_strategy="no", evaluation_strategy="no")
    trainer = Trainer(paddle.nn.Linear(16384, 2), args, train_dataset=Wide(), loss_fn=paddle.nn.CrossEntropyLoss(),
                      callbacks=[KillAWorker()])
    loader = trainer.get_train_dataloader()
    assert isinstance(loader, worker_batches.WorkerLoader)
    with pytest.raises(WorkerKilled, match=r"DataLoader worker \(pid \d+\) was killed by SIGKILL") as info:
        trainer.fit()
    assert info.value.signum == signal.SIGKILL
    deadline = time.monotonic() + patience(10)
    while [p for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE]
