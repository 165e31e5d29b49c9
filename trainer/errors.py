"""The project's exceptions. Each carries an exit code that ``ptrain`` returns.

User-facing conditions raise one of these (never ``assert``, which vanishes
under ``python -O``); the message is one line that names the field, file or
value and says what to do, in the caller's terms: :func:`option` writes a
setting as a flag (``--resume_from_checkpoint auto``) inside ``ptrain`` and
its workers, and as a Python keyword (``resume_from_checkpoint="auto"``) for
a script that calls the Python API::

    >>> option("resume_from_checkpoint", "auto"), option("overwrite_output_dir", True)
    ('resume_from_checkpoint="auto"', 'overwrite_output_dir=True')
    >>> with cli_terms():
    ...     option("resume_from_checkpoint", "auto"), option("overwrite_output_dir", True)
    ('--resume_from_checkpoint auto', '--overwrite_output_dir true')
"""

import contextlib

_CLI = [False]  # set by the ptrain command (trainer.cli.commands.main) while it runs


@contextlib.contextmanager
def cli_terms():
    """Within the block, :func:`option` writes command-line flags (``ptrain`` runs its commands in it)."""
    before = _CLI[0]
    _CLI[0] = True
    try:
        yield
    finally:
        _CLI[0] = before


def pip_extra(extra: str) -> str:
    """How a user installs the project's extra ``extra``: the README's form (the project is installed from its
    checkout, not from an index)::

        >>> pip_extra("serve")
        'pip install -e ".[serve]" in the paddle-trainer checkout'
    """
    return f'pip install -e ".[{extra}]" in the paddle-trainer checkout'


def option(name: str, value=None) -> str:
    """How the caller sets ``name`` (to ``value``): ``--name value`` on the command line, ``name=value`` in Python;
    without a value, the bare name (``--name`` / ``name``)."""
    if _CLI[0]:
        if value is None:
            return f"--{name}"
        text = str(value).lower() if isinstance(value, bool) else str(value)
        return f"--{name} {text}"
    return name if value is None else f"{name}={value!r}".replace("'", '"')


class TrainerError(Exception):
    """Base class of every error this project raises on purpose."""

    exit_code = 1


class ConfigError(TrainerError, ValueError):
    """A bad argument, recipe or command line: fix the input and run again."""

    exit_code = 2


class DataError(TrainerError, ValueError):
    """A missing, empty or malformed dataset, file or batch."""

    exit_code = 3


class CallbackError(TrainerError):
    """A callback raised; the message names the callback and the event.

    The original exception is chained as ``__cause__``.
    """

    exit_code = 4

    def __init__(self, callback_name: str, event: str, error: BaseException):
        self.callback_name = callback_name
        self.event = event
        self.error = error
        super().__init__(
            f"callback {callback_name} failed in on_{event}: "
            f"{type(error).__name__}: {error}"
        )


class TrainingError(TrainerError):
    """Training cannot go on (for example a loss that is not a scalar tensor)."""

    exit_code = 5


class OwnershipLost(TrainerError):
    """This run's lease on its output_dir was taken over (it was paused past the lease, or lost it otherwise):
    it stops before writing anything more there; the message names the new owner. Never restarted."""

    exit_code = 7


class OutOfMemory(TrainingError):
    """Out of memory with a micro-batch of one sample (``auto_find_batch_size`` halved it down to 1), or an
    out-of-memory it cannot retry: the model does not fit in this memory."""

    exit_code = 8


class WorkerKilled(TrainerError):
    """A DataLoader worker was killed by a signal (the OOM killer sends SIGKILL): it raised nothing, so a restart
    from the newest checkpoint can help. Exit code 128 + the signal (137 for SIGKILL), which ``--max_restarts``
    restarts."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class Preempted(TrainerError):
    """``evaluate()`` or ``predict()`` after a preempted ``fit()``: the job is being stopped (its grace period
    runs), so nothing that needs every rank starts; every rank raises this at the same call. Exit code 128 + the
    signal (130 after Ctrl-C, 143 after SIGTERM); uncaught in a script it is one line, and the process ends
    with that code (``trainer.process.hand_off_exit_code``)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum
