"""This process's place in the job, read from the launcher's environment (``PADDLE_TRAINER_ID``,
``PADDLE_TRAINERS_NUM``, ``PADDLE_LOCAL_RANK``): valid before ``init_parallel_env`` and without
importing paddle, so tools that only read files (``ptrain inspect``) start in a fraction of a second.
``trainer.distributed`` re-exports these next to the collectives.
"""

from __future__ import annotations

import os


def get_rank() -> int:
    return int(os.environ.get("PADDLE_TRAINER_ID", "0"))


def get_world_size() -> int:
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def get_local_rank() -> int:
    """Rank within this node (``PADDLE_LOCAL_RANK``, else the global rank)."""
    return int(os.environ.get("PADDLE_LOCAL_RANK", os.environ.get("PADDLE_RANK_IN_NODE", get_rank())))


def is_main_process() -> bool:
    return get_rank() == 0


def is_distributed() -> bool:
    return get_world_size() > 1
