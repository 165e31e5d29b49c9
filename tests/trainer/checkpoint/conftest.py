"""The ``procs`` fixture of the ownership tests: the ``ptrain run`` processes a test started, all stopped at its end."""

from ownership_procs import procs  # noqa: F401 - a fixture
