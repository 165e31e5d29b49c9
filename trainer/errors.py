"""The project's exceptions. Each carries an exit code that ``ptrain`` returns.

User-facing conditions raise one of these (never ``assert``, which vanishes
under ``python -O``); the message is one line that names the field, file or
value and says what to do.
"""


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


class WorkerKilled(TrainerError):
    """A DataLoader worker was killed by a signal (the OOM killer sends SIGKILL): it raised nothing, so a restart
    from the newest checkpoint can help. Exit code 128 + the signal (137 for SIGKILL), which ``--max_restarts``
    restarts."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum
