"""GPUUtilizationMonitor: hardware figures and the data-loading stall share,
handed to the logger through ``trainer.state.logs``.

Events:

- ``on_fit_begin``: on the main process, choose a reader and start a daemon
  thread that calls ``reader.sample()`` every ``interval`` seconds; no thread
  for a reader whose figures are already means over the time since its
  previous reading (``per_record = True``: psutil's CPU share), which is read
  once per record instead (a thread woken every second costs a training
  thread whose ops hold the GIL ~2 ms of CPU a second on a loaded machine:
  0.5% of a ResNet-50 step on this project's CPU, in ``benchmarks/overhead``).
- ``on_step_end``: add ``state.last_data_wait`` and ``state.last_step_time``
  (host clocks the trainer measures; no device sync) to the window. The first
  step of each ``fit()`` and of each epoch is left out: it pays for starting the
  DataLoader iterator (and its workers), a one-off rather than a steady stall.
- ``on_log`` (order 90, before the logger at 100), training records only (the
  ones with ``loss``): add ``data_wait_share`` (seconds waiting for batches /
  seconds of the steps since the previous record, pooled over all ranks) and,
  on the main process, the hardware figures averaged over the samples taken
  since the previous record (a ``per_record`` reader: read here). When the share of a full logging window (at least
  ``logging_steps`` steps) is above ``wait_threshold`` *and* the mean wait per
  measured step is at least ``min_wait`` seconds, warn once, on rank 0, through
  ``logging.getLogger("callbacks.gpu_monitor")``. Both, because a share alone
  misleads on tiny steps: in-memory 8x8 digits spend a third of a 1 ms step
  collating the batch, which costs a second over a whole run and is no loading
  problem that workers would fix. The wait per step is counted without the time
  the machine was too busy to run the training thread (Linux: the run-queue
  delay of ``/proc/thread-self/schedstat``, spread over the window): on a
  machine shared with other jobs every wait stretches many times, and more
  workers would only add to the crowd.
- ``on_fit_end``: stop the thread and close the reader.

Readers (anything with ``sample() -> dict`` and ``close()``):

- :class:`NvmlReader` (when the trainer runs on a GPU and NVML loads): the card
  of the trainer's device only (found by the PCI bus id CUDA reports for it, not
  by NVML's numbering), ``gpu{i}_util`` (%), ``gpu{i}_mem_used_mb``,
  ``gpu{i}_mem_total_mb``, ``gpu{i}_power_w`` and ``gpu{i}_temp_c`` (when the
  card reports them). ``i`` is paddle's device number (``gpu:i``).
- :class:`PsutilReader` (CPU runs, or NVML unavailable): ``cpu_percent`` of the
  training process since the previous record (100 = one core busy) and its
  resident memory ``rss_mb`` at the record; read on the logging step, no thread.

Sampling runs on the main process only: the figures are those of rank 0's card
(NVML) or process (psutil). The stall share is measured on every rank and
summed across ranks at log time (one small all-reduce per record, on the
logging step that already syncs), so all ranks agree on it.

Options: ``interval`` (seconds between samples, default 1.0), ``wait_threshold``
(stall share that triggers the warning, default 0.3), ``min_wait`` (seconds of
waiting per step below which no share is a stall, default 0.01), ``reader`` (a
reader instance; default: chosen at fit start as above). State saved: none.

Example (a reader is any object with ``sample()`` and ``close()``)::

    >>> class Fixed:
    ...     def sample(self):
    ...         return {"gpu0_util": 97.0, "gpu0_mem_used_mb": 1024.0}
    ...     def close(self):
    ...         pass
    >>> monitor = GPUUtilizationMonitor(interval=0.5, reader=Fixed())
    >>> monitor.order
    90
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Dict, Optional

from trainer.errors import ConfigError

from .base import Callback

logger = logging.getLogger("callbacks.gpu_monitor")

_MB = float(1 << 20)


class NvmlReader:
    """Utilization, memory, power and temperature of this process's card through NVML.

    NVML numbers cards in PCI order and sees every card of the node (other
    jobs' too); CUDA numbers them fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
    and within ``CUDA_VISIBLE_DEVICES``. So the card is found by its PCI bus id,
    which CUDA reports for the trainer's device (``gpu:N``): ``bus_id_of(N)``
    (default :func:`cuda_pci_bus_id`, the CUDA driver's
    ``cuDeviceGetPCIBusId``), then ``nvmlDeviceGetHandleByPciBusId_v2``. Keys are
    ``gpu{N}_util`` (%), ``gpu{N}_mem_used_mb``, ``gpu{N}_mem_total_mb``,
    ``gpu{N}_power_w``, ``gpu{N}_temp_c`` (the last two when the card reports them).

    ``nvml`` is the NVML module (default: ``pynvml`` from nvidia-ml-py); any
    object with the same functions works, which is how tests drive this class
    without a GPU. Construction raises when NVML cannot start (no driver) or
    the card cannot be found.
    """

    source = "nvml"

    def __init__(self, device: str = "gpu:0", nvml=None, bus_id_of: Optional[Callable[[int], str]] = None):
        if nvml is None:
            import pynvml as nvml
        self._nvml = nvml
        self.index = int(str(device).partition(":")[2] or 0)
        self.bus_id = (bus_id_of or cuda_pci_bus_id)(self.index)
        nvml.nvmlInit()
        try:
            self._handle = nvml.nvmlDeviceGetHandleByPciBusId_v2(self.bus_id)
        except BaseException:
            nvml.nvmlShutdown()
            raise

    def sample(self) -> Dict[str, float]:
        nvml, handle, key = self._nvml, self._handle, f"gpu{self.index}"
        out = {f"{key}_util": float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)}
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        out[f"{key}_mem_used_mb"] = mem.used / _MB
        out[f"{key}_mem_total_mb"] = mem.total / _MB
        try:  # not every card reports these
            out[f"{key}_power_w"] = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and kin
            pass
        try:
            out[f"{key}_temp_c"] = float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        except Exception:  # noqa: BLE001
            pass
        return out

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def cuda_pci_bus_id(ordinal: int) -> str:
    """PCI bus id (``0000:3B:00.0``) of CUDA device ``ordinal`` of this process, as paddle's
    ``gpu:<ordinal>`` numbers it (same ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``),
    from the CUDA driver library the NVIDIA driver installs (``libcuda.so.1``)."""
    import ctypes

    lib = ctypes.CDLL("libcuda.so.1")

    def check(code: int, call: str) -> None:
        if code != 0:
            raise RuntimeError(f"{call} returned CUDA error {code}")

    check(lib.cuInit(0), "cuInit")
    device = ctypes.c_int()
    check(lib.cuDeviceGet(ctypes.byref(device), int(ordinal)), f"cuDeviceGet({ordinal})")
    buffer = ctypes.create_string_buffer(32)
    check(lib.cuDeviceGetPCIBusId(buffer, len(buffer), device), "cuDeviceGetPCIBusId")
    return buffer.value.decode()


class PsutilReader:
    """CPU utilization and resident memory of one process (default: this one)."""

    source = "psutil"
    #: ``cpu_percent`` is the mean since the previous reading: one reading per record, no sampler thread
    per_record = True

    def __init__(self, pid: Optional[int] = None):
        import psutil

        self._proc = psutil.Process(pid if pid is not None else os.getpid())
        self._proc.cpu_percent(None)  # the first call only starts the measurement

    def sample(self) -> Dict[str, float]:
        with self._proc.oneshot():
            return {"cpu_percent": float(self._proc.cpu_percent(None)),
                    "rss_mb": self._proc.memory_info().rss / _MB}

    def close(self) -> None:
        pass


def runqueue_seconds() -> Optional[float]:
    """Seconds this thread has been runnable but waiting for a CPU (Linux schedstat), or None."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class RunQueueClock:
    """:func:`runqueue_seconds` of the thread that built it, read through one file kept open
    (``pread`` of ``/proc/self/task/<tid>/schedstat``: ~2 us a read against ~30 us to open and
    read the file each time). Read from another thread, it opens the file as
    :func:`runqueue_seconds` does."""

    def __init__(self):
        self.tid = threading.get_native_id()
        try:
            self._fd: Optional[int] = os.open(f"/proc/self/task/{self.tid}/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def seconds(self) -> Optional[float]:
        if self._fd is None or threading.get_native_id() != self.tid:
            return runqueue_seconds()
        try:
            return int(os.pread(self._fd, 128, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _busy_share(start, now) -> float:
    """Share of the wall time between ``start`` and ``now`` (perf_counter, run-queue seconds) this thread
    waited for a CPU."""
    (wall0, queue0), (wall1, queue1) = start, now
    wall = wall1 - wall0
    if queue0 is None or queue1 is None or wall <= 0:
        return 0.0
    return min(max((queue1 - queue0) / wall, 0.0), 1.0)


def _reader_failed(reader, exc: Exception) -> None:
    logger.warning("hardware monitor stopped: %s.sample() failed: %s: %s", type(reader).__name__, type(exc).__name__, exc)


def default_reader(device: str = "gpu:0"):
    """NVML on ``device``'s card for a GPU run when it starts, else psutil (the reason is logged at INFO)."""
    if str(device).startswith("gpu"):
        try:
            return NvmlReader(device)
        except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError_*, no device: fall back
            logger.info("NVML unavailable (%s: %s); monitoring the process with psutil", type(exc).__name__, exc)
    return PsutilReader()


class GPUUtilizationMonitor(Callback):
    order = 90

    def __init__(self, interval: float = 1.0, wait_threshold: float = 0.3, reader=None, min_wait: float = 0.01):
        if not isinstance(interval, (int, float)) or interval <= 0:
            raise ConfigError(f"interval={interval!r} is not allowed: GPUUtilizationMonitor interval must be seconds > 0")
        if not isinstance(wait_threshold, (int, float)) or not 0 < wait_threshold <= 1:
            raise ConfigError(f"wait_threshold={wait_threshold!r} is not allowed: "
                              "GPUUtilizationMonitor wait_threshold must be a share in (0, 1]")
        if not isinstance(min_wait, (int, float)) or min_wait < 0:
            raise ConfigError(f"min_wait={min_wait!r} is not allowed: GPUUtilizationMonitor min_wait must be seconds >= 0")
        if reader is not None and not (callable(getattr(reader, "sample", None)) and callable(getattr(reader, "close", None))):
            raise ConfigError(f"reader={reader!r} is not allowed: a reader has sample() -> dict and close()")
        self.interval = float(interval)
        self.wait_threshold = float(wait_threshold)
        self.min_wait = float(min_wait)
        self.reader = reader
        self.warned = False
        self.samples = 0                             # reader samples taken during the current fit()
        self.last_share: Optional[float] = None     # data_wait_share of the last training record
        self._skip_next_step = True
        self._active = None                          # the reader in use during fit()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._runqueue: Optional[RunQueueClock] = None  # the training thread's, during fit()
        self._reset_samples()
        self._reset_window()

    # ---- the sampler thread ----------------------------------------------
    def note(self) -> str:
        """What it samples, for ``describe_callbacks()`` (a CPU run has no GPU to monitor)."""
        if self.reader is not None:
            return f"reader {type(self.reader).__name__}"
        import paddle

        if str(paddle.device.get_device()).startswith("gpu"):
            return "GPU utilization and memory via NVML, data-loading wait"
        return "CPU run: process CPU and memory via psutil, data-loading wait"

    def _reset_samples(self) -> None:
        self._sums: Dict[str, float] = {}
        self._counts: Dict[str, int] = {}
        self._latest: Dict[str, float] = {}

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                figures = self._active.sample()
            except Exception as exc:  # noqa: BLE001 - a failing reader must not stop training
                _reader_failed(self._active, exc)
                return
            with self._lock:
                for key, value in figures.items():
                    self._sums[key] = self._sums.get(key, 0.0) + float(value)
                    self._counts[key] = self._counts.get(key, 0) + 1
                self._latest = dict(figures)
                self.samples += 1

    def figures(self) -> Dict[str, float]:
        """Mean of each figure over the samples since the last call (the latest
        sample when none was taken since); resets the averaging window."""
        with self._lock:
            if self._counts:
                out = {k: self._sums[k] / self._counts[k] for k in self._sums}
            else:
                out = dict(self._latest)
            self._sums, self._counts = {}, {}
        return {k: round(v, 2) for k, v in out.items()}

    # ---- the stall window ----------------------------------------------------
    def _now(self) -> tuple:
        """(wall clock, run-queue seconds of the training thread)."""
        return time.perf_counter(), (self._runqueue.seconds() if self._runqueue is not None else runqueue_seconds())

    def _reset_window(self, now: Optional[tuple] = None) -> None:
        self._wait = 0.0     # seconds waited for batches, measured steps of this window
        self._time = 0.0     # seconds of the measured steps
        self._steps = 0      # steps in this window, the unmeasured start-up step included
        self._measured = 0   # steps whose wait and time were added
        self._clock = now or self._now()  # wall clock, run-queue delay at the window start

    # ---- events ------------------------------------------------------------------
    def on_fit_begin(self, trainer):
        if self._runqueue is not None:
            self._runqueue.close()
        self._runqueue = RunQueueClock()  # the thread that trains
        self._reset_window()
        self._skip_next_step = True
        self.last_share = None
        if not trainer.is_main_process:
            return
        self._reset_samples()
        self.samples = 0
        self._active = self.reader if self.reader is not None else default_reader(getattr(trainer, "device", "cpu"))
        if getattr(self._active, "per_record", False):
            return  # read in on_log
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="GPUUtilizationMonitor", daemon=True)
        self._thread.start()

    def on_step_end(self, trainer):
        self._steps += 1
        first_of_epoch = trainer.state.step_in_epoch == 1
        if self._skip_next_step or first_of_epoch:  # loader start-up: a one-off, not a steady-state stall
            self._skip_next_step = False
            return
        self._wait += trainer.state.last_data_wait
        self._time += trainer.state.last_step_time
        self._measured += 1

    def on_log(self, trainer):
        logs = trainer.state.logs
        if "loss" not in logs:  # evaluation records carry no step timings
            return
        wait, time_, steps, measured = self._wait, self._time, self._steps, self._measured
        now = self._now()
        busy = _busy_share(self._clock, now)
        self._reset_window(now)
        own_wait = wait * (1.0 - busy)  # waiting for data, not for a CPU
        if trainer.world_size > 1:  # every rank logs the same records, so every rank gets here
            from trainer.distributed import reduce_scalars

            wait, time_, measured, own_wait = reduce_scalars([wait, time_, measured, own_wait], op="sum")
        if time_ > 0:
            share = wait / time_
            per_step = own_wait / max(measured, 1)
            self.last_share = share
            logs["data_wait_share"] = round(share, 4)
            if (share > self.wait_threshold and per_step >= self.min_wait and steps >= trainer.args.logging_steps
                    and not self.warned and trainer.is_main_process):
                self.warned = True
                logger.warning(
                    "data loading stall: %.0f%% of step time over the last %d steps (up to step %d) was spent "
                    "waiting for the next batch, %.1f ms a step (threshold %.0f%% and %.0f ms); raise "
                    "dataloader_num_workers (now %d) or make the dataset's __getitem__ cheaper",
                    100 * share, steps, trainer.state.global_step, 1e3 * per_step, 100 * self.wait_threshold,
                    1e3 * self.min_wait, trainer.args.dataloader_num_workers)
        if self._thread is not None:
            logs.update(self.figures())
        elif self._active is not None:  # a per_record reader, on the main process
            logs.update(self._read_now())

    def _read_now(self) -> Dict[str, float]:
        try:
            figures = self._active.sample()
        except Exception as exc:  # noqa: BLE001 - a failing reader must not stop training
            _reader_failed(self._active, exc)
            self._close_reader()
            return {}
        self.samples += 1
        return {k: round(float(v), 2) for k, v in figures.items()}

    def _close_reader(self) -> None:
        if self._active is not None and self._active is not self.reader:
            self._active.close()  # a reader we built; a given one belongs to the caller
        self._active = None

    def on_fit_end(self, trainer):
        runqueue, self._runqueue = self._runqueue, None
        if runqueue is not None:
            runqueue.close()
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout=self.interval + 5.0)
        self._close_reader()
