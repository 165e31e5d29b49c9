"""What the project's own console lines look like, so a test can judge a run's console by our format rather than
by a library's exact text (trainer/cli/console.py: the quiet console)."""

import re

#: our log records ("INFO trainer: ...", "WARNING callbacks.x: ..."), ptrain's own lines ("ptrain: ..."), the
#: logger's "key=value ..." records and the closing "run directory: ..." line
OURS = re.compile(r"^(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?:trainer|callbacks|models|ptrain)(?:\.[\w.]+)?: "
                  r"|ptrain: |[a-z_]+=\S|run directory: )")


def foreign_lines(*outputs: str) -> list:
    """The lines of ``outputs`` (a run's stdout, stderr) that are not ours."""
    return [line for text in outputs for line in text.splitlines() if line.strip() and not OURS.match(line)]
