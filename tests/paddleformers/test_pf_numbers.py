"""PaddleFormers' numbers: tests/paddleformers/scripts/pf_finetune.py (a PaddleFormers 1.2 fine-tuning
script: a tiny random Llama or ERNIE 4.5, full or LoRA, warmup, weight decay, clipping; once with a cosine
schedule down to ``min_lr`` and dropout over two epochs, once with recompute) runs under
PaddleFormers' Trainer and, with only its ``Trainer`` import changed, under ours, in subprocesses: on one
process, and on two under ``paddle.distributed.launch`` (plain data parallel, ``sharding=""``, and sharding
stage 1 where PaddleFormers' own Trainer runs on CPU: ``split_param`` off, no clipping). Every record its
``on_log`` hook gets has the same keys, and every value that is not a clock or memory reading (loss,
learning_rate, global_step, progress_or_epoch, train_loss) agrees within 1e-6; so do ``train()``'s
results, and ``trainer_state.json``'s ``consumed_samples``; ours keeps those records in its log history.

The differences this closes (trainer.compat.paddleformers_recipe): the training order (``paddle.seed(seed +
epoch)`` then ``paddle.randperm``, which also decides the dropout masks that follow; on two processes over the
first ``n // 2 * 2`` samples, interleaved), the
schedule (its ``get_scheduler`` with ``min_lr``), the log record's keys (``cpu_used_memory``...), and the
arguments (``sharding``/``sharding_parallel_size``/``split_param`` onto our layout).
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pf_helpers import BASE_ARGS, read_logs, read_state, run_script, script_source  # noqa: E402

TOLERANCE = 1e-6
MODES = {"full": ["--lora", "false"], "lora": ["--lora", "true"]}
LAYOUTS = {"one": (1, []), "dp": (2, ["--sharding="]),
           # PaddleFormers' stage 1 on CPU: split_param needs amp_master_grad, its clipping hits '_inner_opt'
           "stage1": (2, ["--sharding", "stage1", "--split_param", "false", "--max_grad_norm", "0"])}
CASES = [("llama", "full", "one", []), ("llama", "lora", "one", ["--recompute_granularity", "full"]),
         ("ernie4_5", "full", "one", ["--lr_scheduler_type", "cosine", "--min_lr", "5e-4", "--dropout", "0.1", "--samples", "16"]), ("ernie4_5", "lora", "one", []),
         ("llama", "full", "dp", []), ("ernie4_5", "lora", "dp", []),
         ("ernie4_5", "full", "stage1", []), ("llama", "lora", "stage1", [])]


def _not_compared(key: str) -> bool:
    """Clock and host-memory readings: they differ between any two runs."""
    return "runtime" in key or "per_second" in key or key.endswith("_memory")


def compare(theirs: dict, ours: dict, where: str) -> float:
    """Records of the two runs, key by key; returns the largest difference of a compared value."""
    t, o = theirs["logs"], ours["logs"]
    assert len(t) == len(o), f"{where}: PaddleFormers logged {len(t)} records, ours {len(o)}"
    worst = 0.0
    for i, (a, b) in enumerate(zip(t, o)):
        assert set(a) == set(b), (f"{where} record {i}: keys differ: only PaddleFormers' {sorted(set(a) - set(b))}, "
                                  f"only ours {sorted(set(b) - set(a))}")
        for key, value in a.items():
            if _not_compared(key):
                continue
            assert abs(value - b[key]) <= TOLERANCE, f"{where} record {i} {key}: PaddleFormers {value!r}, ours {b[key]!r}"
            worst = max(worst, abs(value - b[key]))
    assert theirs["global_step"] == ours["global_step"]
    assert abs(theirs["training_loss"] - ours["training_loss"]) <= TOLERANCE, where
    return worst


def test_only_the_import_differs():
    import difflib

    theirs, ours = script_source(False).splitlines(True), script_source(True).splitlines(True)
    changed = [line for line in difflib.unified_diff(theirs, ours, n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == ["-from paddleformers.trainer import Trainer\n", "+from trainer import Trainer\n"]


@pytest.mark.parametrize("model,mode,layout,extra", CASES, ids=[f"{m}-{k}-{lay}" for m, k, lay, _ in CASES])
def test_every_logged_value_is_paddleformers(tmp_path, model, mode, layout, extra):
    nproc, layout_args = LAYOUTS[layout]
    argv = BASE_ARGS + ["--model", model] + MODES[mode] + layout_args + extra
    runs = {name: run_script(tmp_path, name, ours, argv, nproc=nproc) for name, ours in (("theirs", False), ("ours", True))}
    theirs, ours = read_logs(runs["theirs"]), read_logs(runs["ours"])
    worst = compare(theirs, ours, f"{model} {mode} {layout}")
    print(f"\n{model} {mode} {layout}: max |diff| {worst:.3g}")
    for a, b in zip(theirs["logs"], ours["logs"]):
        if "loss" in a:
            print(f"  step {a['global_step']}: loss {a['loss']:.8f} / {b['loss']:.8f}  "
                  f"lr {a['learning_rate']:.4e} / {b['learning_rate']:.4e}")
    # trainer_state.json: PaddleFormers' consumed_samples; ours keeps the records it logged (PaddleFormers' is empty)
    their_state, our_state = read_state(runs["theirs"]), read_state(runs["ours"])
    assert our_state["consumed_samples"] == their_state["consumed_samples"] > 0
    assert [{k: v for k, v in r.items() if k != "step"} for r in our_state["log_history"]] == ours["logs"]
