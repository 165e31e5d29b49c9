"""GPUUtilizationMonitor's run-queue clock: the training thread's schedstat through one open file."""

import os
import subprocess
import sys
import threading
import time

import pytest
from patience import patience

from callbacks.gpu_monitor import RunQueueClock, runqueue_seconds

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="Linux schedstat only")


def _spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_the_clock_reads_its_own_threads_run_queue_delay_as_the_file_does():
    clock = RunQueueClock()
    try:
        first, direct = clock.seconds(), runqueue_seconds()
        assert first is not None and 0 <= direct - first < 0.05  # the same figure, read twice
        # more runnable work than cores: this spinning thread waits in the run queue
        spin = "import time\nend = time.perf_counter() + 1.5\nwhile time.perf_counter() < end: pass"
        hogs = [subprocess.Popen([sys.executable, "-S", "-c", spin]) for _ in range(os.cpu_count() + 1)]
        try:
            _spin(1.0)
        finally:
            codes = [p.wait(timeout=patience(30)) for p in hogs]
        assert codes == [0] * len(hogs)
        later = clock.seconds()
        assert later > first
        assert abs(later - runqueue_seconds()) < 0.05
    finally:
        clock.close()
    assert abs(clock.seconds() - runqueue_seconds()) < 0.05  # closed: it opens the file each time


def test_read_from_another_thread_it_gives_that_threads_figure():
    clock = RunQueueClock()
    seen = {}

    def other():
        seen["tid"], seen["clock"], seen["file"] = threading.get_native_id(), clock.seconds(), runqueue_seconds()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    clock.close()
    assert seen["tid"] != clock.tid
    assert seen["clock"] is not None and abs(seen["clock"] - seen["file"]) < 0.05
