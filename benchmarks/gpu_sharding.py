"""GPU rows of ``benchmarks/gpu_check.py`` for ``trainer.parallel``: what the CPU suite runs only through the
test-only shim (tests/parallel/cpu_sharding_shim.py) or not at all, run unshimmed on the first two cards.

- ``sharding``: sharding stage 2 and stage 3 (paddle's ``group_sharded_parallel``, NCCL) on 2 cards train like
  one card on the same global batch (float32: max loss difference within 1e-5), and so does stage 1 (fleet);
  the product path takes paddle's guards, CUDA copies and ``cvt_to_device`` unchanged. With 4+ cards also
  dp 2 x sharding 2 (stages 1 and 2), which paddle's gloo cannot build on CPU.
- ``sharding_offload_amp``: ``sharding="stage2 offload"`` and ``"stage3 offload"`` with AMP fp16 O2 (paddle
  offloads only low-precision weights) and stage 2 with ``amp_master_grad`` (bf16 O2) finish with finite losses
  within 0.05 of the float32 single-card run.

Needs 2+ cards (SKIP otherwise). ``python benchmarks/gpu_check.py --only sharding,sharding_offload_amp``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 8


def worker(out_dir: str, opts: dict) -> None:
    """One rank: a residual MLP whose blocks stage 3 slices (1040 x 1040 > 2**20), trained by the Trainer."""
    import numpy as np
    import paddle

    from trainer import Trainer, TrainingArguments
    from trainer import distributed as dist

    class Blocks(paddle.nn.Layer):
        def __init__(self, hidden=1040):
            super().__init__()
            self.inp = paddle.nn.Linear(16, hidden)
            self.blocks = paddle.nn.LayerList([paddle.nn.Linear(hidden, hidden) for _ in range(2)])
            self.head = paddle.nn.Linear(hidden, 4)

        def forward(self, x):
            h = paddle.tanh(self.inp(x))
            for block in self.blocks:
                h = h + paddle.tanh(block(h))
            return self.head(h)

    class Data(paddle.io.Dataset):
        def __init__(self, n=128):
            rng = np.random.RandomState(7)
            self.x = rng.randn(n, 16).astype("float32")
            self.y = np.abs(self.x[:, :4]).argmax(1).astype("int64")

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return self.x[i], self.y[i]

    paddle.seed(1)
    model = Blocks()
    world = dist.get_world_size()
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=16 // world, max_steps=STEPS,
                             learning_rate=1e-4, logging_steps=1, max_grad_norm=0.5, report_to=[],
                             save_strategy="no", evaluation_strategy="no", device=opts.get("device", "gpu"),
                             sharding=opts.get("sharding", ""), amp=opts.get("amp", "off"),
                             amp_level=opts.get("amp_level", "O1"), amp_master_grad=opts.get("master_grad", False),
                             recompute=opts.get("recompute", False),
                             sharding_parallel_degree=opts.get("sharding_parallel_degree", -1))
    state = Trainer(model, args, train_dataset=Data(), loss_fn=paddle.nn.CrossEntropyLoss()).fit()
    if dist.get_rank() == 0:
        with open(os.path.join(out_dir, "losses.json"), "w", encoding="utf-8") as f:
            json.dump([r["loss"] for r in state.log_history if "loss" in r], f)


def launch_on_cards(script: str, tmp: str, name: str, opts: dict, cards: str) -> str:
    """``script OUT JSON_OPTIONS`` under paddle's launcher on ``cards`` ("0,1"); returns OUT (``tmp/name``)."""
    out = os.path.join(tmp, name)
    os.makedirs(out, exist_ok=True)
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--devices", cards, "--log_dir",
           os.path.join(out, "log"), script, out, json.dumps(opts)]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=REPO, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: launch exited {proc.returncode}: {proc.stderr[-400:]}")
    return out


def compare_on_cards(run, n: int, one: dict, modes, tolerance: float):
    """``run(name, opts, cards) -> {step: loss}`` on one card, then on each ``(name, opts, cards)`` of ``modes`` that
    ``n`` cards allow: (PASS or FAIL, the max loss difference per mode); a mode with a non-finite loss fails."""
    base = run("one-card", one, "0")
    worst, parts = 0.0, []
    for name, opts, cards in modes:
        if cards > n:
            parts.append(f"{name} skipped ({cards} cards)")
            continue
        losses = run(name.replace(" ", ""), opts, ",".join(str(i) for i in range(cards)))
        finite = all(math.isfinite(v) for v in losses.values())
        diff = max(abs(losses[k] - base[k]) for k in base) if finite else float("inf")
        worst = max(worst, diff)
        parts.append(f"{name} {diff:.2g}")
    return ("PASS" if worst <= tolerance else "FAIL"), f"max loss difference vs one card (limit {tolerance}): " + \
        ", ".join(parts)


def _run(tmp: str, name: str, opts: dict, cards: str) -> list:
    out = launch_on_cards(os.path.abspath(__file__), tmp, name, opts, cards)
    with open(os.path.join(out, "losses.json"), encoding="utf-8") as f:
        return json.load(f)


def _compare(tmp: str, n: int, modes: dict, tolerance: float):
    if n < 2:
        return "SKIP", "needs 2+ cards (group_sharded_parallel refuses a group of one)"
    one = _run(tmp, "one-card", {}, "0")
    worst, parts = 0.0, []
    for name, opts in modes.items():
        cards = opts.pop("cards", 2)
        if cards > n:
            parts.append(f"{name} skipped ({cards} cards)")
            continue
        losses = _run(tmp, name.replace(" ", "-"), opts, ",".join(str(i) for i in range(cards)))
        diff = max(abs(a - b) for a, b in zip(losses, one)) if all(math.isfinite(x) for x in losses) else float("inf")
        worst = max(worst, diff)
        parts.append(f"{name} {diff:.2g}")
    return ("PASS" if worst <= tolerance else "FAIL"), f"max loss difference vs one card (limit {tolerance}): " + ", ".join(parts)


def check_sharding(n: int, tmp: str):
    return _compare(tmp, n, {"stage1": {"sharding": "stage1"}, "stage2": {"sharding": "stage2"},
                             "stage3": {"sharding": "stage3"}, "stage3+recompute": {"sharding": "stage3", "recompute": True},
                             # dp 2 x sharding 2: paddle's gloo cannot build these groups on CPU (connection refused)
                             "dp2 x stage1": {"sharding": "stage1", "sharding_parallel_degree": 2, "cards": 4},
                             "dp2 x stage2": {"sharding": "stage2", "sharding_parallel_degree": 2, "cards": 4}},
                    1e-5)


def check_offload_amp(n: int, tmp: str):
    return _compare(tmp, n, {"stage2 offload fp16 O2": {"sharding": "stage2 offload", "amp": "fp16", "amp_level": "O2"},
                             "stage3 offload fp16 O2": {"sharding": "stage3 offload", "amp": "fp16", "amp_level": "O2"},
                             "stage2 bf16 O2 master_grad": {"sharding": "stage2", "amp": "bf16", "amp_level": "O2",
                                                            "master_grad": True}},
                    0.05)


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    worker(sys.argv[1], json.loads(sys.argv[2]))
