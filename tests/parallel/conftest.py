"""The one-process references of the parity files (tests/parallel/parity.py), computed once per file."""

import pytest
from parallel.parity import one_process


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cache = {}

    def run(variant):
        if variant not in cache:
            cache[variant] = one_process(str(tmp_path_factory.mktemp(f"one-{variant.replace('+', '-')}")), variant)
        return cache[variant]

    return run
