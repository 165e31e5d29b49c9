"""The console of ``ptrain``: what a user sees by default and what ``--verbose`` adds.

By default a run prints the progress bar, one line per evaluation, warnings
that say something true about the run, and the closing summary:

* log records go through :class:`BarSafeHandler` (``tqdm.write``), so a line
  never tears the progress bar; the project's own loggers (``trainer``,
  ``callbacks``, ``models``) show INFO and up, every other library WARNING and up;
  ranks other than 0 show warnings only;
* Python warnings are logged as one line (``py.warnings``), without the source
  line that ``warnings`` would echo (the bare ``warnings.warn(`` line);
* known, harmless notices of paddle and its dependencies (:data:`NOISE`, each
  with the reason it is safe) are dropped;
* paddle's and PaddleNLP's own log lines and warnings below ERROR (fleet's ``[INFO]
  topology.py`` lines, "nccl reduce_avg requires paddle compiled with cuda", "rank 0
  is not in group ...", under every layout) stay off the console: their loggers, which
  print through handlers of their own, hand their records to the project's
  handlers instead (:class:`LibraryLogger`), and a rank of paddle's launcher writes
  them to ``paddle.RANK.log`` beside its ``workerlog.RANK`` (the launcher's
  ``--log_dir``: ``PADDLE_LOG_DIR``);
* paddle's C++ log lines below ERROR (glog ``I``/``W`` lines such as
  ``Paddle static graph(PIR) not support input out tensor for now!!!!!`` during
  export, or the ``tcp_store`` connection lines under the launcher) are hidden
  by setting ``GLOG_minloglevel=2`` before paddle loads, unless the variable is
  already set;
* under ``paddle.distributed.launch`` the launcher's own INFO lines (its
  configuration dump) are hidden (``--log_level WARNING`` on its command line,
  ``trainer.launch.restarts``; not ``PADDLE_LOG_LEVEL``, which the launcher
  answers with "LAUNCH WARNING args log_level will be overridden") and the
  "Modified FLAGS detected" banner of ``init_parallel_env`` is logged at DEBUG
  (``trainer.distributed.stderr_to_debug``).

``--verbose`` shows all of it: DEBUG of the project's loggers (e.g. which old
checkpoints rotation removed), INFO of the libraries, every warning, paddle's
C++ log lines and the launcher's configuration. ``configure`` is only called by
the ``ptrain`` command; a script that imports the Trainer keeps its own logging.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings

OWN_LOGGERS = ("trainer", "callbacks", "models", "ptrain")

# (start of the message, why it is safe to drop): warnings every run would show, none of them actionable
NOISE = (
    ("No ccache found", "paddle's import-time notice for building C++ extensions; ptrain builds none"),
    ("When training, we now always track global mean and variance",
     "paddle's BatchNorm says it updates its running statistics in training mode, which is what training wants"),
    ("Setuptools is replacing distutils",
     "setuptools' stand-in for the standard library's distutils, imported by a dependency of paddlenlp"),
    ("full_graph=False don't support input_spec",
     "paddle.jit.to_static's notice when a model is converted; the export passes input_spec to paddle.jit.save"),
)

_configured = {"verbose": False}

#: the libraries whose log lines and warnings below ERROR go to the log file, not the console (logger names and the
#: package a warning comes from)
LIBRARIES = ("paddle", "paddlenlp", "PaddleNLP")
_LIBRARY_DIRS: tuple = ()   # the libraries' package folders (a warning's filename), set by configure


def is_library_record(record: logging.LogRecord) -> bool:
    """Whether ``record`` is a library's (:data:`LIBRARIES`): its logger's, or a warning raised in its code."""
    return record.name.split(".")[0] in LIBRARIES or bool(getattr(record, "library", False))


class LibraryLogger(logging.Logger):
    """The class of loggers made after :func:`configure`: paddle's ``get_logger`` (and PaddleNLP's ``Logger``) give
    each of their loggers a stream handler of its own on stderr and turn propagation off; a library logger here
    drops that handler and keeps propagating, so its records reach the project's handlers (the console shows them
    with ``--verbose``, a launched rank's log file always)."""

    def __init__(self, name: str, level=logging.NOTSET):
        self._library = name.split(".")[0] in LIBRARIES
        super().__init__(name, level)

    @property
    def propagate(self) -> bool:
        return self._propagate or self._library

    @propagate.setter
    def propagate(self, value: bool) -> None:
        self._propagate = value

    def addHandler(self, hdlr: logging.Handler) -> None:  # noqa: N802 - logging's name
        if self._library and _writes_to_console(hdlr):
            return
        super().addHandler(hdlr)


def _console_streams() -> tuple:
    """The objects a handler writing to the console holds: ``sys.stdout``/``sys.stderr`` now, the interpreter's
    own, and what :func:`trainer.process.guard_console` wrapped (a handler made before the guard, e.g. by a
    paddle imported from a sitecustomize, holds the stream beneath it)."""
    streams = (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)
    return streams + tuple(getattr(s, "guarded", None) for s in streams if getattr(s, "guarded", None) is not None)


def _on_console(handler: logging.Handler) -> bool:
    return getattr(handler, "stream", None) in _console_streams()


def _writes_to_console(handler: logging.Handler) -> bool:
    return type(handler) is logging.StreamHandler and _on_console(handler)


def _route_libraries() -> None:
    """Library loggers made before :func:`configure` (paddle imported first): the same as :class:`LibraryLogger`."""
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.split(".")[0] in LIBRARIES:
            for handler in [h for h in logger.handlers if _writes_to_console(h)]:
                logger.removeHandler(handler)
                logger.propagate = True


class _ConsoleFilter(logging.Filter):
    """The console shows a library's records below ERROR only with ``--verbose``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _configured["verbose"] or record.levelno >= logging.ERROR or not is_library_record(record)


class _LibraryFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return is_library_record(record)


def library_log_file() -> str:
    """Where a rank of paddle's launcher writes the libraries' lines: ``paddle.RANK.log`` in the launcher's log
    folder ('' outside a launch)."""
    folder = os.environ.get("PADDLE_LOG_DIR")
    if not folder or "PADDLE_TRAINER_ID" not in os.environ:
        return ""
    return os.path.join(folder, f"paddle.{os.environ.get('PADDLE_TRAINER_ID') or 0}.log")


class BarSafeHandler(logging.StreamHandler):
    """A stream handler that writes through ``tqdm.write``: an active progress bar is
    cleared, the line printed, the bar redrawn (plain printing when no bar is active)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def is_noise(message: str) -> bool:
    """Whether ``message`` starts like one of the known harmless notices in :data:`NOISE`."""
    text = str(message).lstrip()
    return any(text.startswith(start) for start, _ in NOISE)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    if not _configured["verbose"] and is_noise(str(message)):
        return
    where = os.path.join(*filename.split(os.sep)[-3:]) if filename else "?"
    text = " ".join(str(message).split())  # one line
    library = bool(filename) and os.path.abspath(filename).startswith(_LIBRARY_DIRS)
    logging.getLogger("py.warnings").warning("%s: %s (%s:%s)", category.__name__, text, where, lineno,
                                             extra={"library": library})


def _site_dirs() -> list:
    """The folders packages are installed in (where a library's files are)."""
    import site
    import sysconfig

    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    dirs.update(getattr(site, "getsitepackages", lambda: [])())
    return sorted(os.path.abspath(d) for d in dirs)


def child_environment(verbose: bool) -> None:
    """Environment defaults that quiet paddle's C++ logs and the launcher, here and in every
    process started from here (set only where the user has not set them)."""
    if verbose:
        return
    os.environ.setdefault("GLOG_minloglevel", "2")     # glog: ERROR and FATAL only (read when paddle loads)
    # the launcher process imports paddle too; PYTHONWARNINGS is comma-separated: each start up to its first comma
    quiet = ",".join(f"ignore:{start.split(',')[0]}" for start, _ in NOISE)
    current = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = f"{current},{quiet}" if current else quiet


def configure(verbose: bool = False, main_process: bool = True) -> None:
    """Set up the console for a ``ptrain`` command (see the module docstring)."""
    _configured["verbose"] = bool(verbose)
    child_environment(verbose)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.StreamHandler) and _on_console(handler):
            root.removeHandler(handler)
    handler = BarSafeHandler(sys.stderr)
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s" if verbose else "%(levelname)s %(name)s: %(message)s"
    handler.setFormatter(logging.Formatter(fmt))
    handler.addFilter(_ConsoleFilter())
    root.addHandler(handler)
    _route_libraries()
    logging.setLoggerClass(LibraryLogger)
    global _LIBRARY_DIRS
    _LIBRARY_DIRS = tuple(os.path.join(d, name) + os.sep for name in LIBRARIES for d in _site_dirs())
    path = library_log_file()
    if path:
        file_handler = logging.FileHandler(path, encoding="utf-8", delay=True)  # no empty file when nothing comes
        file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        file_handler.addFilter(_LibraryFilter())
        root.addHandler(file_handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    own = logging.DEBUG if verbose else logging.INFO
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(own if main_process else logging.WARNING)
    warnings.showwarning = _show_warning
    if verbose:  # importing trainer filtered paddle's ccache notice (trainer/__init__.py): --verbose shows it
        warnings.filterwarnings("default", message=re.escape(NOISE[0][0]))
    else:
        for start, _ in NOISE:
            warnings.filterwarnings("ignore", message=re.escape(start))
