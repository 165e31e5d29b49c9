"""Which rank is behind: progress that the ranks share outside any collective (for ``StallWatchdog``).

In synchronous data parallelism a rank that stalls makes every other rank
stall too, inside the collective that waits for it, so each rank's own clock
only says "no step for N s". Each rank's watchdog thread therefore writes a
small file ``output_dir/.ptrain-progress/rank<r>.json`` every check interval
with its progress mark (``(finished steps, stage, evaluation batches)``, a
host tuple the training loop sets at no cost), and a stalled rank reads them
all: the rank(s) with the lowest mark are behind, the others wait for them.
A file that stopped changing means a rank that is dead or frozen; no file, a
rank that never got that far (or an ``output_dir`` that is not shared between
nodes).

    >>> where((3, 1, 0))
    'in step 4, before the gradient exchange (loading data or computing)'
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import List, Optional, Tuple

logger = logging.getLogger("callbacks.watchdog")

PROGRESS_DIR = ".ptrain-progress"
Mark = Tuple[int, int, int]  # (finished steps, 0 after a step | 1 before the gradient exchange | 2 in it, eval batches)


def where(mark: Mark) -> str:
    """What a progress mark means, in words."""
    step, stage, batches = mark
    if stage == 1:
        return f"in step {step + 1}, before the gradient exchange (loading data or computing)"
    if stage == 2:
        return f"in the gradient exchange or optimizer update of step {step + 1}"
    if batches:
        return f"in the evaluation after step {step}, {batches} batches done"
    return f"after step {step} (logging, evaluating or saving)"


class ProgressBoard:
    """This rank's progress file, and the blame read from every rank's."""

    def __init__(self, out_dir: str, rank: int, world_size: int, check_interval: float):
        self.out_dir, self.rank, self.world_size = out_dir, rank, world_size
        self.fresh_within = max(3 * check_interval, 2.0)  # a file older than this: no sign of life
        self._warned = False

    def path(self, rank: int) -> str:
        return os.path.join(self.out_dir, PROGRESS_DIR, f"rank{rank}.json")

    def publish(self, mark: Mark, reported: bool = False) -> None:
        """Called by the watchdog thread (never the training loop), so a rank blocked in a collective or a read
        still shows where it is; ``reported``: this rank has written its stall report (see :meth:`wait_for_reports`)."""
        path = self.path(self.rank)
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"rank": self.rank, "key": list(mark), "where": where(mark), "time": time.time(),
                           "pid": os.getpid(), "reported": reported}, f)
            os.replace(tmp, path)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                logger.warning("StallWatchdog: cannot share this rank's progress in %s (%s): a stall report will "
                               "not name the rank that is behind", path, exc)

    def wait_for_reports(self, grace: float, poll: float) -> List[int]:
        """Wait, at most ``grace`` seconds, until every other rank has written its stall report or gives no sign of
        life (its file missing or unchanged for ``fresh_within``): a rank that stops ends the job, and the ranks
        waiting for it in a collective are then aborted by the backend before their own reports. The ranks still
        without a report, if any."""
        deadline = time.monotonic() + grace
        while True:
            now = time.time()
            pending = [r for r, info in self._others() if info is not None and not info.get("reported")
                       and now - info["time"] <= self.fresh_within]  # no file: nothing to wait for
            if not pending or time.monotonic() >= deadline:
                return pending
            time.sleep(poll)

    def _others(self):
        """``(rank, its progress or None)`` for every other rank: None when its file is missing or unreadable."""
        for r in range(self.world_size):
            if r == self.rank:
                continue
            try:
                with open(self.path(r), encoding="utf-8") as f:
                    info = json.load(f)
                yield r, {"key": tuple(info["key"]), "where": str(info["where"]), "time": float(info["time"]),
                          "reported": bool(info.get("reported"))}
            except (OSError, ValueError, KeyError, TypeError):
                yield r, None

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.remove(self.path(self.rank))

    def blame(self, mark: Mark) -> Optional[str]:
        """One sentence naming the rank(s) behind and whom this rank waits for."""
        now = time.time()
        seen, silent = {}, []
        for r, info in self._others():
            if info is None:
                silent.append(r)
            else:
                seen[r] = (info["key"], info["where"], now - info["time"])
        own_where = where(mark)
        seen[self.rank] = (tuple(mark), own_where, 0.0)
        dead = [r for r, (_, _, age) in seen.items() if age > self.fresh_within]
        lowest, highest = min(k for k, _, _ in seen.values()), max(k for k, _, _ in seen.values())
        behind = sorted(r for r, (key, _, _) in seen.items() if key == lowest and key < highest)
        parts = []
        for r in behind:
            _, place, age = seen[r]
            parts.append(f"rank {r} is behind: {place}" + (f" (no sign of life for {age:.0f} s)" if r in dead else ""))
        for r in silent:
            parts.append(f"rank {r} shared no progress (dead before its first check, or output_dir is not shared)")
        for r in dead:
            if r not in behind:
                parts.append(f"rank {r} gives no sign of life for {seen[r][2]:.0f} s (killed or frozen)")
        if not parts:
            return f"every rank is at the same point ({own_where}): no rank is behind the others"
        waited = behind or silent or dead
        if self.rank in waited:
            others = sorted(set(range(self.world_size)) - set(waited))
            if others:
                parts.append(("ranks " + ", ".join(map(str, others)) + " wait" if len(others) > 1
                              else f"rank {others[0]} waits") + " for it")
        else:
            parts.append(f"rank {self.rank} waits for rank {', '.join(map(str, waited))} ({own_where})")
        return "; ".join(parts)
