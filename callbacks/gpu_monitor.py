"""GPUUtilizationMonitor: hardware figures and the data-loading stall share,
handed to the logger through ``trainer.state.logs``.

Events:

- ``on_fit_begin``: on the main process, choose a reader and start a daemon
  thread that calls ``reader.sample()`` every ``interval`` seconds.
- ``on_step_end``: add ``state.last_data_wait`` and ``state.last_step_time``
  (host clocks the trainer measures; no device sync) to the window. The first
  step of each ``fit()`` and of each epoch is left out: it pays for starting the
  DataLoader iterator (and its workers), a one-off rather than a steady stall.
- ``on_log`` (order 90, before the logger at 100), training records only (the
  ones with ``loss``): add ``data_wait_share`` (seconds waiting for batches /
  seconds of the steps since the previous record, pooled over all ranks) and,
  on the main process, the hardware figures averaged over the samples taken
  since the previous record. When the share of a full logging window (at least
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

- :class:`NvmlReader` (when the trainer runs on a GPU and NVML loads): per GPU
  visible to this process (``CUDA_VISIBLE_DEVICES`` indices or UUIDs, else every
  GPU of the node), ``gpu{i}_util`` (%), ``gpu{i}_mem_used_mb``,
  ``gpu{i}_mem_total_mb``, ``gpu{i}_power_w`` and ``gpu{i}_temp_c`` (when the
  card reports them). ``i`` is paddle's device number (``gpu:i``).
- :class:`PsutilReader` (CPU runs, or NVML unavailable): ``cpu_percent`` of the
  training process (100 = one core busy) and its resident memory ``rss_mb``.

Sampling runs on the main process only: NVML sees every GPU of the node, so on
one machine that covers all ranks (on several nodes, node 0's); psutil figures
are those of the rank-0 process. The stall share is measured on every rank and
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
from typing import Dict, List, Optional

from trainer.errors import ConfigError

from .base import Callback

logger = logging.getLogger("callbacks.gpu_monitor")

_MB = float(1 << 20)


class NvmlReader:
    """Per-GPU utilization, memory, power and temperature through NVML.

    ``nvml`` is the NVML module (default: ``pynvml`` from nvidia-ml-py); any
    object with the same functions works, which is how tests drive this
    class without a GPU. Construction raises when NVML cannot start (no driver)
    or finds no GPU.
    """

    source = "nvml"

    def __init__(self, devices: Optional[List[str]] = None, nvml=None):
        if nvml is None:
            import pynvml as nvml
        self._nvml = nvml
        nvml.nvmlInit()
        try:
            wanted = devices if devices is not None else _visible_devices()
            if wanted is None:
                wanted = [str(i) for i in range(nvml.nvmlDeviceGetCount())]
            self._handles = [self._handle(d) for d in wanted]
            if not self._handles:
                raise RuntimeError("NVML sees no GPU for this process")
        except BaseException:
            nvml.nvmlShutdown()
            raise

    def _handle(self, device: str):
        if device.isdigit():
            return self._nvml.nvmlDeviceGetHandleByIndex(int(device))
        return self._nvml.nvmlDeviceGetHandleByUUID(device)

    def sample(self) -> Dict[str, float]:
        nvml, out = self._nvml, {}
        for i, handle in enumerate(self._handles):
            out[f"gpu{i}_util"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            out[f"gpu{i}_mem_used_mb"] = mem.used / _MB
            out[f"gpu{i}_mem_total_mb"] = mem.total / _MB
            try:  # not every card reports these
                out[f"gpu{i}_power_w"] = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
            except Exception:  # noqa: BLE001 - NVMLError_NotSupported and kin
                pass
            try:
                out[f"gpu{i}_temp_c"] = float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            except Exception:  # noqa: BLE001
                pass
        return out

    def close(self) -> None:
        self._nvml.nvmlShutdown()


class PsutilReader:
    """CPU utilization and resident memory of one process (default: this one)."""

    source = "psutil"

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


def _busy_share(start) -> float:
    """Share of the wall time since ``start`` (perf_counter, run-queue seconds) this thread waited for a CPU."""
    wall0, queue0 = start
    queue1 = runqueue_seconds()
    wall = time.perf_counter() - wall0
    if queue0 is None or queue1 is None or wall <= 0:
        return 0.0
    return min(max((queue1 - queue0) / wall, 0.0), 1.0)


def default_reader(device: str = "gpu"):
    """NVML for a GPU run when it starts, else psutil (the reason is logged at INFO)."""
    if str(device).startswith("gpu"):
        try:
            return NvmlReader()
        except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError_*, no device: fall back
            logger.info("NVML unavailable (%s: %s); monitoring the process with psutil", type(exc).__name__, exc)
    return PsutilReader()


def _visible_devices() -> Optional[List[str]]:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [d.strip() for d in value.split(",") if d.strip() and d.strip() != "-1"]


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
        self._reset_samples()
        self._reset_window()

    # ---- the sampler thread ----------------------------------------------
    def _reset_samples(self) -> None:
        self._sums: Dict[str, float] = {}
        self._counts: Dict[str, int] = {}
        self._latest: Dict[str, float] = {}

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                figures = self._active.sample()
            except Exception as exc:  # noqa: BLE001 - a failing reader must not stop training
                logger.warning("hardware monitor stopped: %s.sample() failed: %s: %s",
                               type(self._active).__name__, type(exc).__name__, exc)
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
    def _reset_window(self) -> None:
        self._wait = 0.0     # seconds waited for batches, measured steps of this window
        self._time = 0.0     # seconds of the measured steps
        self._steps = 0      # steps in this window, the unmeasured start-up step included
        self._measured = 0   # steps whose wait and time were added
        self._clock = (time.perf_counter(), runqueue_seconds())  # wall clock, run-queue delay at the window start

    # ---- events ------------------------------------------------------------------
    def on_fit_begin(self, trainer):
        self._reset_window()
        self._skip_next_step = True
        self.last_share = None
        if not trainer.is_main_process:
            return
        self._reset_samples()
        self.samples = 0
        self._active = self.reader if self.reader is not None else default_reader(getattr(trainer, "device", "cpu"))
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
        busy = _busy_share(self._clock)
        self._reset_window()
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

    def on_fit_end(self, trainer):
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=self.interval + 5.0)
        if self._active is not None and self._active is not self.reader:
            self._active.close()  # a reader we built; a given one belongs to the caller
        self._active = None
