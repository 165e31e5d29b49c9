"""Loss and metric curves as a PNG (matplotlib, headless)."""

from __future__ import annotations

from typing import List


def plot_curves(history: List[dict], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(r["step"], r["loss"]) for r in history if "loss" in r and "step" in r]
    metric_keys = sorted({k for r in history for k in r if k.startswith("eval_") and k != "eval_samples"})
    panels = 1 + bool(metric_keys)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
    ax = axes[0][0]
    if train:
        ax.plot([s for s, _ in train], [v for _, v in train], label="train loss")
    for key in metric_keys:
        if key.endswith("loss"):
            pts = [(r["step"], r[key]) for r in history if key in r]
            ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    if metric_keys:
        ax2 = axes[0][1]
        for key in metric_keys:
            if not key.endswith("loss"):
                pts = [(r["step"], r[key]) for r in history if key in r]
                ax2.plot([s for s, _ in pts], [v for _, v in pts], marker="o", label=key)
        ax2.set_xlabel("step")
        ax2.set_ylabel("metric")
        ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
