"""The suite's waits stretch with the machine's load (tests/patience.py), within bounds."""

import os

import patience


def test_an_idle_machine_keeps_the_limit(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert patience.load_factor() == 1.0 and patience.patience(120) == 120


def test_a_busy_machine_stretches_the_limit_by_its_load_per_core(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0 * cores, 0.0, 0.0))
    assert patience.load_factor() == 3.0 and patience.patience(20) == 60


def test_the_stretch_is_bounded_so_a_hang_is_still_caught(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (1e6, 0.0, 0.0))
    assert patience.load_factor() == patience.MAX_FACTOR
