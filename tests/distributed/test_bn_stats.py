"""BatchNorm statistics: every rank evaluates (and the checkpoint keeps) rank 0's."""

import json
import os

from helpers import launch

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "bn_stats.py")


def test_ranks_with_different_bn_statistics_evaluate_with_rank0s(tmp_path):
    launch(WORKER, [tmp_path], nproc=2, log_dir=str(tmp_path / "logs"))
    ranks = []
    for r in (0, 1):
        with open(tmp_path / f"rank{r}.json") as f:
            ranks.append(json.load(f))
    assert ranks[0]["mean"] == ranks[1]["mean"] == [1.0] * 4  # rank 1 had 2.0: broadcast from rank 0
    assert ranks[0]["variance"] == ranks[1]["variance"] == [1.0] * 4
    assert ranks[0]["eval_loss"] == ranks[1]["eval_loss"]
