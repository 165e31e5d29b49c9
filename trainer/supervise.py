"""Supervision of the launcher process (minimal placeholder: engineer "lifetime" owns the real one)."""

from __future__ import annotations

import subprocess
from typing import List, Optional


def run_launcher(cmd: List[str], env: Optional[dict] = None) -> int:
    """Run ``cmd`` (a ``paddle.distributed.launch`` line) to its end; its exit code."""
    return subprocess.call(cmd, env=env)
