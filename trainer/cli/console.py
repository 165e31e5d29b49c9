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
    logging.getLogger("py.warnings").warning("%s: %s (%s:%s)", category.__name__, text, where, lineno)


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
        if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) in (sys.stderr, sys.stdout):
            root.removeHandler(handler)
    handler = BarSafeHandler(sys.stderr)
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s" if verbose else "%(levelname)s %(name)s: %(message)s"
    handler.setFormatter(logging.Formatter(fmt))
    root.addHandler(handler)
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
