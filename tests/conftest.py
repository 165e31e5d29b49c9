"""Makes ``from helpers import ...`` work in test files.

The repository root goes first on sys.path, so ``trainer`` and ``callbacks``
resolve to the packages and never to the ``tests/trainer`` or
``tests/callbacks`` folders; ``tests/`` goes last, for ``helpers``.
"""

import importlib.metadata
import os
import signal
import sys

import pytest
import pytest_timeout

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(TESTS))
sys.path.append(TESTS)

from patience import patience  # noqa: E402 - needs tests/ on sys.path

_STOP_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1)


def _as_from_a_terminal() -> None:
    """The stop signals as a terminal's shell starts a command: handled or at their defaults, never ignored.

    A suite started by a script as ``cmd &`` runs with SIGINT ignored, under ``nohup`` with SIGHUP ignored, and an
    ignored signal stays ignored across ``exec``: every ``ptrain`` the tests start would keep it ignored, as it
    should (``trainer.process.IGNORED_AT_START``), and the tests that send it would wait in vain. Before any
    module of ours reads them; xdist's workers start from this process and inherit the defaults."""
    changed = []
    for sig in _STOP_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
            changed.append(signal.Signals(sig).name + " ignored")
    blocked = set(signal.pthread_sigmask(signal.SIG_BLOCK, [])) & set(_STOP_SIGNALS)
    if blocked:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
        changed += [signal.Signals(sig).name + " blocked" for sig in sorted(blocked)]
    return changed


_as_from_a_terminal()


def pytest_runtest_teardown(item):
    """A test that leaves a stop signal ignored or blocked in the test process would hand it to every command the
    next tests start (an ignored or blocked signal is inherited across ``exec``; ``ptrain`` keeps an ignored one
    ignored): put back, and named in the run's warnings."""
    changed = _as_from_a_terminal()
    if changed:
        item.warn(pytest.PytestWarning(f"{item.nodeid} left {', '.join(changed)} in the test process (put back)"))


def _compiled_once() -> None:
    """Byte-code for the project's own modules, compiled once for the whole run.

    The suite starts a few hundred Python processes (``ptrain``, launchers, ranks, toy workers). Where
    byte-code writing is off (``PYTHONDONTWRITEBYTECODE=1``, common in CI images), each of them would
    compile ~100 of the project's modules from source again: 0.25 s of CPU a process. They are compiled
    here once, into the ``__pycache__`` folders Python itself would write (git ignores them), as
    ``pip install`` does for an installed package; the installed libraries have theirs already. Python
    checks each file's size and mtime against its byte-code, so an edited file is compiled afresh. A
    read-only checkout is left as it is.
    """
    if not sys.flags.dont_write_bytecode or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # Python writes its byte-code itself; or the run's first process compiled it already
    import compileall

    repo = os.path.dirname(TESTS)
    for package in ("trainer", "callbacks", "models", "benchmarks", "tests"):
        compileall.compile_dir(os.path.join(repo, package), quiet=2, workers=1)


_compiled_once()


# tests/paddleformers/ runs in the PaddleFormers environment (pip install -e ".[paddleformers,test]", which has no
# paddlenlp: .ci/run makes it), and is not collected where paddleformers is not installed (the two libraries
# cannot share an environment). Its installed distribution is asked, not the import system: tests/ is on sys.path,
# where the folder tests/paddleformers/ itself would be found as a namespace package.
try:
    HAS_PADDLEFORMERS = bool(importlib.metadata.version("paddleformers"))
except importlib.metadata.PackageNotFoundError:
    HAS_PADDLEFORMERS = False
collect_ignore = [] if HAS_PADDLEFORMERS else ["paddleformers"]


#: the free space the suite needs where its temporary folders go (its runs' checkpoints, logs and exports): the
#: README's suite peaked at 1.5 GB under pytest's base folder (.ci/run, 4 workers); PTRAIN_TEST_MIN_FREE_GB overrides
MIN_FREE_GB = float(os.environ.get("PTRAIN_TEST_MIN_FREE_GB", "3"))


def pytest_sessionstart(session):
    """A disk without room for the suite stops it before the first test with one line, instead of hundreds of
    tests failing at random places with ``No space left on device`` (seen in CI: 17 failed, 830 errors)."""
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the first process checked
    import shutil
    import tempfile

    folder = str(session.config.option.basetemp or tempfile.gettempdir())
    while not os.path.exists(folder):
        folder = os.path.dirname(folder) or "."
    free = shutil.disk_usage(folder).free / 2**30
    if free < MIN_FREE_GB:
        pytest.exit(f"only {free:.1f} GB free in {folder}; the suite needs about {MIN_FREE_GB:g} GB there (its runs' "
                    "checkpoints and logs): free space, or point TMPDIR (or --basetemp) at a larger disk", returncode=4)


def pytest_report_header(config):
    if not HAS_PADDLEFORMERS:
        return "tests/paddleformers/: not collected (no paddleformers here; .ci/run runs them in an environment of its own)"


# PTRAIN_TEST_CPU=FILE: one JSON line per test with its wall time and the CPU seconds of the test's
# process and the children it waited for (the suite's cost on a core, whatever the machine's load)
if os.environ.get("PTRAIN_TEST_CPU"):
    import json
    import resource
    import time

    import pytest

    def _cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        cpu, wall = _cpu(), time.monotonic()
        yield
        with open(os.environ["PTRAIN_TEST_CPU"], "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": item.nodeid, "cpu": round(_cpu() - cpu, 2),
                                "wall": round(time.monotonic() - wall, 2), "end": round(time.time(), 2),
                                "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}) + "\n")


# The files that take longest (wall seconds on a 2-core machine, PTRAIN_TEST_CPU), longest first. The workers
# take files in collection order (``--dist loadfile --no-loadscope-reorder`` in setup.cfg: xdist would otherwise
# order files by their number of tests, which put test_restart's 2 tests of 75 s last), so these go first: a run
# that ended on one of them would leave the other workers idle for its last minutes. The order of the tests
# inside a file is kept.
LONGEST_FIRST = (
    "tests/docs/test_doc_commands.py",                  # ~4 min of CPU (every documented ptrain command)
    "tests/trainer/test_host_memory.py",                # 400-step RSS slopes, 1 and 2 processes
    "tests/parallel/test_recompute_dp.py",              # two 2-process ERNIE runs
    "tests/distributed/test_sharded_checkpoint.py",     # 300 s (9 two-process launches)
    "tests/distributed/test_sharded_checkpoint_stage3.py",  # 280
    "tests/distributed/test_elastic.py",                # 270 s
    "tests/parallel/test_parity_stage2_stage3.py",      # 270
    "tests/parallel/test_parity_dp_stage1.py",          # 250
    "tests/callbacks/test_nan_guard_default.py",        # 230 (the 1- and 2-process nan-loss launches)
    "tests/distributed/test_slurm.py",                  # 165 (skipped without root and slurm-wlm)
    "tests/trainer/checkpoint/test_fencing.py",         # 125
    "tests/callbacks/test_mlflow_tracker.py",           # 150 (mlflow server starts in 60-130 s)
    "tests/models/test_resnet_cli.py",                  # 145
    "tests/distributed/test_preemption_launcher.py",    # 135
    "tests/models/test_ernie_task.py",                  # 120
    "tests/trainer/deploy/test_serve_hostile.py",       # 120 (1,100 slow connections, model files changed)
    "tests/models/test_serve_tasks.py",                 # 110
    "tests/trainer/cli/test_cli.py",                    # 95
    "tests/trainer/deploy/test_serve_v2.py",            # 90
    "tests/trainer/checkpoint/test_ownership.py",       # 95
    "tests/benchmarks/test_smoke.py",                   # 80
    "tests/models/test_resnet_dali.py",                 # 75
    "tests/distributed/test_restart.py",                # 75
    "tests/trainer/checkpoint/test_lock.py",            # 70
    "tests/distributed/test_failure_names.py",          # 65
    "tests/models/test_resnet_turbo.py",                # 60
    "tests/trainer/deploy/test_serve.py",               # 55
    "tests/callbacks/test_trackers_two_processes.py",   # 60
    "tests/compat/test_token_classification.py",        # 55
)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's limit (300 s, or a test's own mark) stretched by the machine's load when the test
    starts (``tests/patience.py``): the limit catches hangs, and a busy machine is not a hang."""
    stretched = settings._replace(timeout=patience(settings.timeout))
    return pytest_timeout.pytest_timeout_set_timer(item, stretched)


def pytest_collection_modifyitems(session, config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    repo = os.path.dirname(TESTS)

    def key(item):
        path = os.path.relpath(str(item.path), repo).replace(os.sep, "/")
        return rank.get(path, len(LONGEST_FIRST))

    items.sort(key=key)  # stable: the rest keep their order
