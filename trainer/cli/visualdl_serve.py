"""``ptrain visualdl --logdir OUTPUT_DIR [visualdl options]``: VisualDL's own server,
made to answer every request.

With the pinned set (visualdl 2.5.3, Flask 3.1, Werkzeug 3.1) plain ``visualdl
--logdir DIR`` answers HTTP 500 to any page request whose ``Accept-Language``
header names neither English nor Chinese, or is missing, as with ``curl``,
scripts and health checks: visualdl picks the page language with
``request.accept_languages.best_match(["en", "zh"])``, gets None, and hands it to
``response.set_cookie``, which raises (``TypeError`` in the cookie quoting).
No Werkzeug release takes a None cookie value (checked: 2.2.3, 2.3.8, 3.0.6,
3.1.8), and Flask 3.1 needs Werkzeug >= 3.1, so no pin fixes it.

This command runs the same server (``visualdl.server.app.main``, same flags)
with one WSGI middleware, :class:`LanguageFallback`, that appends
``en;q=0.001`` to the request's ``Accept-Language``: a browser's own choice
still wins, and a request without one gets English instead of an error.
``visualdl --logdir DIR --language en`` is the alternative with plain visualdl
(it fixes the page language for everyone).
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from ..errors import ConfigError

FALLBACK = "en;q=0.001"


class LanguageFallback:
    """WSGI middleware: every request carries an ``Accept-Language`` visualdl can match.

    >>> seen = {}
    >>> app = LanguageFallback(lambda environ, start: seen.update(environ) or [])
    >>> _ = app({}, None); seen["HTTP_ACCEPT_LANGUAGE"]
    'en;q=0.001'
    >>> _ = app({"HTTP_ACCEPT_LANGUAGE": "zh-CN,zh;q=0.9"}, None); seen["HTTP_ACCEPT_LANGUAGE"]
    'zh-CN,zh;q=0.9, en;q=0.001'
    """

    def __init__(self, app, fallback: str = FALLBACK):
        self.app, self.fallback = app, fallback

    def __call__(self, environ, start_response):
        header = environ.get("HTTP_ACCEPT_LANGUAGE", "").strip()
        environ["HTTP_ACCEPT_LANGUAGE"] = f"{header}, {self.fallback}" if header else self.fallback
        return self.app(environ, start_response)


def main(argv: Optional[List[str]] = None) -> int:
    """Run VisualDL's server with ``argv`` as its command line (``--logdir DIR --port N ...``). A ``--logdir`` that
    does not exist is one ConfigError line (visualdl would serve an empty board)."""
    argv = sys.argv[1:] if argv is None else argv
    if sum(a == "--logdir" or a.startswith("--logdir=") for a in argv) > 1:  # visualdl would keep the last alone
        raise ConfigError("--logdir is given more than once (visualdl keeps only the last): give it once, followed "
                          "by every folder, e.g. ptrain visualdl --logdir runs/a runs/b")
    from visualdl.server import app as vdl

    parse_args, create_app = vdl.parse_args, vdl.create_app

    def parse_args_and_check():  # visualdl's own parser (--logdir takes several folders, or --logdir=DIR)
        args = parse_args()
        for folder in args.get("logdir") or []:
            if not os.path.isdir(folder):
                raise ConfigError(f"--logdir {folder}: not a folder: give a run's output_dir (its visualdl/ holds "
                                  "the records), e.g. ptrain visualdl --logdir runs/digits-demo")
        return args

    def create_app_with_fallback(args):
        app = create_app(args)  # sets SIGINT back to SIG_DFL: our handlers go in after it
        app.wsgi_app = LanguageFallback(app.wsgi_app)
        _stop_on_signals()
        return app

    vdl.parse_args, vdl.create_app = parse_args_and_check, create_app_with_fallback  # looked up at call time
    _stop_on_signals()
    sys.argv = ["visualdl", *argv]
    vdl.main()
    return 0


def _stop_on_signals() -> None:
    """SIGTERM / SIGINT stop the server with one line that says so (not the trainer's "outside training")."""
    import signal

    from ..process import exit_now, startup_handlers_active

    startup_handlers_active(False)

    def stop(signum, frame):
        name = signal.Signals(signum).name
        exit_now(128 + signum, f"ptrain visualdl: stopped by {name}, server closed (exit {128 + signum})")

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)


if __name__ == "__main__":
    sys.exit(main())
