"""The training curves beside a run: `<run_dir>/plots/loss.png`, drawn from history.jsonl when the run ends
(rank 0), and logged to W&B as an image when W&B is on.

matplotlib is imported here only, with the Agg backend: no display is needed, and a run that never
plots never imports it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional, Sequence

LOSS_PNG = Path("plots") / "loss.png"


def finite(x: Any) -> Optional[float]:
    """x as a float when it is a finite number (history keeps NaN/inf as strings), else None."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


LOSS = (("loss", "loss"),)


def series(rows: Sequence[dict[str, Any]], metrics: Sequence[tuple[str, str]] = LOSS) -> list[tuple[str, list, list]]:
    """(label, steps, finite values) of each metric (label, history key) that some row holds finite."""
    out = []
    for label, key in metrics:
        drawn = [(r["step"], finite(r.get(key))) for r in rows if "step" in r and finite(r.get(key)) is not None]
        if drawn:
            out.append((label, *map(list, zip(*drawn))))
    return out


def loss_curve(rows: Sequence[dict[str, Any]], path: Path, title: str,
               metrics: Sequence[tuple[str, str]] = LOSS) -> Optional[Path]:
    """The objective's metrics (`metrics`: (label, key), the loss by default; one panel each, the first
    tallest) and the learning rate under them, by optimizer step; None, and no file, when no row has a
    finite value of the first. Steps whose value is not finite are not drawn; the title counts them."""
    panels = series(rows, metrics)
    steps_all = [r["step"] for r in rows if "step" in r]
    if not panels or panels[0][0] != metrics[0][0]:
        return None
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    n = len(panels)
    fig, axes = plt.subplots(n + 1, 1, figsize=(8, 4 + 1.6 * n), height_ratios=[3] + [2] * (n - 1) + [1],
                             sharex=True)
    for i, (ax, (label, steps, values)) in enumerate(zip(axes, panels)):
        color = f"C{i + 2 if i else 0}"  # C1 is the learning rate's
        ax.plot(steps, values, "-", marker="o" if len(steps) <= 50 else None, ms=3, lw=1.5, color=color)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.annotate(f"{values[-1]:.4f}", (steps[-1], values[-1]), textcoords="offset points", xytext=(4, 6), fontsize=9)
    label, steps, values = panels[0]
    missing = len(steps_all) - len(steps)
    subtitle = f"{len(steps_all)} steps; {label}: first {values[0]:.4f}, last {values[-1]:.4f}, min {min(values):.4f}"
    if missing:
        subtitle += f"; {missing} step(s) without a finite {label} not drawn"
    axes[0].set_title(f"{title}\n{subtitle}", fontsize=10)
    ax_lr = axes[-1]
    lrs = [(r["step"], finite(r.get("lr"))) for r in rows if "step" in r and finite(r.get("lr")) is not None]
    if lrs:
        ax_lr.plot(*zip(*lrs), "-", color="C1", lw=1.2)
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("optimizer step")
    ax_lr.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_lr.grid(alpha=0.3)
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_loss_plot(run_dir: Path, title: str, metrics: Sequence[tuple[str, str]] = LOSS) -> Optional[Path]:
    """`<run_dir>/plots/loss.png` from `<run_dir>/history.jsonl` (every segment of a resumed run)."""
    from align.telemetry.history import read_history

    history = Path(run_dir) / "history.jsonl"
    if not history.is_file():
        return None
    return loss_curve(read_history(history), Path(run_dir) / LOSS_PNG, title, metrics)


def plot_run(run_dir: Path, name: str, logger: Any, metrics: Sequence[tuple[str, str]] = LOSS) -> Optional[Path]:
    """The end-of-run plot of the objective's metrics (rank 0: the rank with a history), into W&B as
    well. A plot that fails is a warning: it never decides the run's exit code."""
    import logging

    from align.core.redaction import redact_value

    try:  # the title is written too: a token-shaped run name is redacted as in the manifest
        path = write_loss_plot(run_dir, f"training: {redact_value('name', name)}", metrics)
        if path is not None:
            logger.image("plots/loss", path)
        return path
    except Exception as e:
        logging.getLogger("align").warning("%s not written: %s: %s", Path(run_dir) / LOSS_PNG, type(e).__name__, e)
        return None
