"""Level 5 plot: reward, validation score, losses, KL, entropy and grad norm by step (baseline overlaid, dashed).

matplotlib is a dependency (verl's vLLM image has it too), imported only here, with the Agg backend (no display on GPU hosts).
"""

from __future__ import annotations

from pathlib import Path

from sessions.judge import metrics as m

PLOT_PNG = "metrics.png"

PANELS = (
    ("reward", lambda k: k in m.REWARD_KEYS),
    ("validation score", lambda k: bool(m.VALIDATION_RE.search(k))),
    ("losses", lambda k: bool(m.LOSS_RE.search(k))),
    ("KL", lambda k: bool(m.KL_RE.search(k))),
    ("entropy", lambda k: bool(m.ENTROPY_RE.search(k))),
    ("grad norm", lambda k: bool(m.GRAD_NORM_RE.search(k))),
)


class PlotUnavailable(RuntimeError):
    pass


def plot_metrics(path: Path, step_metrics: m.StepMetrics, baseline: m.StepMetrics | None = None,
                 title: str = "") -> Path:
    """Write a PNG with one panel per metric family; raises PlotUnavailable when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise PlotUnavailable(f"matplotlib not importable ({e}): reinstall this project (pip install -e .)") from None

    keys = sorted({k for row in step_metrics.values() for k in row})
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), squeeze=False)
    for ax, (name, wanted) in zip(axes.flat, PANELS, strict=True):
        shown = [k for k in keys if wanted(k)]
        for i, key in enumerate(shown):
            color = f"C{i}"
            pts = m.series(step_metrics, key)
            ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", markersize=3, color=color, label=key)
            if baseline:
                base = m.series(baseline, key)
                if base:
                    ax.plot([s for s, _ in base], [v for _, v in base], linestyle="--", color=color, alpha=0.7,
                            label=f"{key} (baseline)")
        ax.set_title(name)
        ax.set_xlabel("step")
        if shown:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
