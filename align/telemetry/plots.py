"""The loss curve beside a run: `<run_dir>/plots/loss.png`, drawn from history.jsonl when the run ends
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


def loss_curve(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Optional[Path]:
    """Loss (and the learning rate under it) by optimizer step; None, and no file, when no row has a
    finite loss. Steps whose loss is not finite are not drawn; the title counts them."""
    points = [(r["step"], finite(r.get("loss"))) for r in rows if "step" in r]
    drawn = [(s, v) for s, v in points if v is not None]
    if not drawn:
        return None
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    fig, (ax, ax_lr) = plt.subplots(2, 1, figsize=(8, 5.5), height_ratios=[3, 1], sharex=True)
    steps, losses = zip(*drawn)
    ax.plot(steps, losses, "-", marker="o" if len(drawn) <= 50 else None, ms=3, lw=1.5, color="C0")
    ax.set_ylabel("loss (CE per loss token)")
    ax.grid(alpha=0.3)
    ax.annotate(f"{losses[-1]:.4f}", (steps[-1], losses[-1]), textcoords="offset points", xytext=(4, 6), fontsize=9)
    missing = len(points) - len(drawn)
    subtitle = f"{len(points)} steps, first {losses[0]:.4f}, last {losses[-1]:.4f}, min {min(losses):.4f}"
    if missing:
        subtitle += f"; {missing} non-finite step(s) not drawn"
    ax.set_title(f"{title}\n{subtitle}", fontsize=10)
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


def write_loss_plot(run_dir: Path, title: str) -> Optional[Path]:
    """`<run_dir>/plots/loss.png` from `<run_dir>/history.jsonl` (every segment of a resumed run)."""
    from align.telemetry.history import read_history

    history = Path(run_dir) / "history.jsonl"
    if not history.is_file():
        return None
    return loss_curve(read_history(history), Path(run_dir) / LOSS_PNG, title)


def plot_run(run_dir: Path, name: str, logger: Any) -> Optional[Path]:
    """The end-of-run plot (rank 0: the rank with a history), into W&B as well. A plot that fails is a
    warning: it never decides the run's exit code."""
    import logging

    from align.run.redaction import redact_value

    try:  # the title is written too: a token-shaped run name is redacted as in the manifest
        path = write_loss_plot(run_dir, f"training loss: {redact_value('name', name)}")
        if path is not None:
            logger.image("plots/loss", path)
        return path
    except Exception as e:
        logging.getLogger("align").warning("%s not written: %s: %s", Path(run_dir) / LOSS_PNG, type(e).__name__, e)
        return None
