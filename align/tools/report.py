"""`python -m align.tools.report DIR` (or `dir=DIR`; `out=` for --out): one row per job of a multirun (or one
run) dir, printed and plotted.

Per job: the overrides that differ between jobs, real (unpadded) tokens/s, padding waste, the
fraction of zero-pad micro-batches, roots per accumulation window and the final loss, all read from
the job's `.hydra/overrides.yaml` and `history.jsonl`. Tokens/s leaves out step 1 (it carries
one-time costs: allocator warm-up, first-call dispatch). Writes report.json and report.png into DIR.
A torn last line of a history (a kill during an append) is skipped and noted; any other line that is not a
JSON row refuses the report with file:line (exit 2).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Optional

from align.errors import EXIT_CONFIG, AlignError
from align.telemetry.history import history_lines
from align.tools import keyed_argv


def job_dirs(root: Path) -> list[Path]:
    """The run dirs under `root` (a multirun dir), or `root` itself when it is a run dir."""
    if (root / "history.jsonl").is_file() or (root / ".hydra").is_dir():
        return [root]
    jobs = [p for p in root.iterdir() if p.is_dir() and ((p / ".hydra").is_dir() or (p / "history.jsonl").is_file())]
    return sorted(jobs, key=lambda p: (0, int(p.name)) if p.name.isdigit() else (1, p.name))


def _overrides(job: Path) -> list[str]:
    f = job / ".hydra" / "overrides.yaml"
    if not f.is_file():
        return []
    from omegaconf import OmegaConf

    return [str(x) for x in OmegaConf.load(f)]


def _history(job: Path) -> tuple[list[dict[str, Any]], Optional[int]]:
    """The job's rows and the number of a torn last line that was skipped (align.telemetry.history)."""
    f = job / "history.jsonl"
    if not f.is_file():
        return [], None
    rows, torn = history_lines(f)
    return [row for _, row in rows], torn


def _num(x: Any) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(float(x)) else None


def job_row(job: Path) -> dict[str, Any]:
    rows, torn = _history(job)
    out: dict[str, Any] = {"job": job.name, "overrides": _overrides(job), "steps": len(rows)}
    if torn is not None:  # what a kill during an append leaves: the rows before it are whole
        out["torn_last_line"] = f"{job / 'history.jsonl'}:{torn}"
    if not rows:
        return {**out, "status": "no history"}
    timed = rows[1:] or rows
    time_s = sum(r.get("step_time_s", 0.0) for r in timed)
    tokens = sum(r.get("tokens", 0) for r in rows)
    real = sum(r.get("real_tokens", 0) for r in rows)
    with_stats = [r for r in rows if "pad_waste" in r]
    out.update(
        status="ok",
        real_tokens_per_s=sum(r.get("real_tokens", 0) for r in timed) / time_s if time_s else None,
        tokens_per_s=sum(r.get("tokens", 0) for r in timed) / time_s if time_s else None,
        pad_waste=1.0 - real / tokens if tokens else None,
        zero_pad_frac=sum(r["zero_pad_frac"] for r in with_stats) / len(with_stats) if with_stats else None,
        roots_per_window=sum(r["roots_in_window"] for r in with_stats) / len(with_stats) if with_stats else None,
        final_loss=_num(rows[-1].get("loss")),
    )
    return out


def shared_overrides(rows: list[dict[str, Any]]) -> set[str]:
    """Overrides every job (that recorded any) shares: printed once, not per row."""
    sets = [set(r["overrides"]) for r in rows if r["overrides"]]
    return set.intersection(*sets) if len(sets) > 1 else set()


def format_table(rows: list[dict[str, Any]]) -> str:
    common = shared_overrides(rows)
    lines = [f"jobs: {len(rows)}; shared overrides: {' '.join(sorted(common)) or '-'}"]
    head = (f"{'job':>4}  {'overrides':<44} {'steps':>5} {'real tok/s':>10} {'pad waste':>9} {'zero-pad':>8} "
            f"{'roots/win':>9} {'final loss':>10}")
    lines.append(head)
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    for r in rows:
        ov = " ".join(o for o in r["overrides"] if o not in common) or "-"
        if r["status"] != "ok":
            lines.append(f"{r['job']:>4}  {ov:<44} {r['steps']:>5} {r['status']}")
            continue
        lines.append(f"{r['job']:>4}  {ov:<44} {r['steps']:>5} {fmt(r['real_tokens_per_s'], ',.0f'):>10} "
                     f"{pct(r['pad_waste']):>9} {pct(r['zero_pad_frac']):>8} "
                     f"{fmt(r['roots_per_window'], '.2f'):>9} {fmt(r['final_loss'], '.4f'):>10}")
    lines += [f"note: {r['torn_last_line']}: torn last line skipped (a kill during an append)"
              for r in rows if r.get("torn_last_line")]
    return "\n".join(lines)


# (row key, panel title, scale, value format): the numbers a sweep is compared on.
PANELS = (("real_tokens_per_s", "real (unpadded) tokens/s", 1, ",.0f"), ("pad_waste", "padding waste (%)", 100, ".1f"),
          ("final_loss", "final loss", 1, ".4f"))


def axis_limits(values: list[float]) -> tuple[float, float]:
    """x limits of a dot panel. From 0 when the values spread over much of their own size (the ratio
    between them reads off the axis); zoomed onto the values when they are close (bars from 0 would
    all look the same), with room for the labels."""
    lo, hi = min(values), max(values)
    span = hi - lo
    if lo >= 0 and span >= 0.5 * hi:
        return 0.0, hi * 1.15 if hi > 0 else 1.0
    pad = span * 0.25 if span > 0 else max(abs(hi) * 0.01, 1e-6)
    return lo - pad, hi + pad


def plot(rows: list[dict[str, Any]], path: Path, title: str = "", curves: Optional[dict[str, list]] = None) -> None:
    from align.telemetry.plots import pyplot

    fig = figure(rows, title, curves)
    fig.savefig(path, dpi=100)
    pyplot().close(fig)


def figure(rows: list[dict[str, Any]], title: str = "", curves: Optional[dict[str, list]] = None):
    """One dot per job in each panel (its value printed beside it), and the loss curves of every job
    below: a sweep's jobs often differ in the third digit of the loss, which bars from 0 hide."""
    from matplotlib.ticker import MaxNLocator

    from align.telemetry.plots import pyplot

    plt = pyplot()
    ok = [r for r in rows if r["status"] == "ok"]
    common = shared_overrides(rows)
    labels = [" ".join(o for o in r["overrides"] if o not in common) or f"job {r['job']}" for r in ok]
    curves = {k: v for k, v in (curves or {}).items() if v}
    fig = plt.figure(figsize=(15, 2.6 + 0.45 * len(ok) + (3.6 if curves else 0)))
    grid = fig.add_gridspec(2 if curves else 1, 3, height_ratios=[1.0 + 0.3 * len(ok), 3.2] if curves else None)
    y = list(range(len(ok)))[::-1]  # job 0 on top, as in the printed table
    for i, (key, panel, scale, fmt) in enumerate(PANELS):
        ax = fig.add_subplot(grid[0, i])
        have = [(yy, r[key] * scale) for yy, r in zip(y, ok) if r[key] is not None]
        ax.set_yticks(y, labels if i == 0 else [""] * len(y), fontsize=9)
        ax.set_ylim(-0.6, len(ok) - 0.4)
        ax.set_title(panel, fontsize=11)
        ax.grid(axis="x", alpha=0.3)
        if not have:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes, color="gray")
            continue
        lo, hi = axis_limits([v for _, v in have])
        ax.hlines([yy for yy, _ in have], lo, [v for _, v in have], color="0.85", lw=1)
        ax.plot([v for _, v in have], [yy for yy, _ in have], "o", ms=8, color="C0")
        ax.set_xlim(lo, hi)
        for yy, v in have:
            ax.annotate(format(v, fmt), (v, yy), textcoords="offset points", xytext=(0, 9), ha="center", fontsize=9)
    if curves:
        ax = fig.add_subplot(grid[1, :])
        for label, (_job, pts) in zip(labels, ((r["job"], curves.get(r["job"], [])) for r in ok)):
            if pts:
                ax.plot(*zip(*pts), "-", lw=1.5, label=label)
        ax.set_xlabel("optimizer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("loss (CE per loss token)")
        ax.set_title("loss by step", fontsize=11)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9, loc="upper right")
    shared = " ".join(sorted(common))
    fig.suptitle(f"{title or 'align.tools.report'}: {len(ok)} of {len(rows)} jobs with history"
                 + (f"\nshared: {shared}" if shared else ""), fontsize=12)
    fig.tight_layout()
    return fig


def loss_points(job: Path) -> list[tuple[int, float]]:
    """(step, loss) of every step of a job whose loss is finite."""
    from align.telemetry.plots import finite

    points = [(r["step"], finite(r.get("loss"))) for r in _history(job)[0] if "step" in r]
    return [(s, v) for s, v in points if v is not None]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m align.tools.report", description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="a multirun dir (multirun/<sweep>) or one run dir")
    ap.add_argument("--out", type=Path, default=None, help="where report.json and report.png go (default: DIR)")
    args = ap.parse_args(keyed_argv(sys.argv[1:] if argv is None else argv, ("dir",), ("out",)))
    if not args.dir.is_dir():
        print(f"align: error: {args.dir}: no such directory", file=sys.stderr)
        return EXIT_CONFIG
    jobs = job_dirs(args.dir)
    if not jobs:
        print(f"align: error: {args.dir}: no job dirs (expected <dir>/<n>/.hydra or history.jsonl)", file=sys.stderr)
        return EXIT_CONFIG
    try:
        rows = [job_row(j) for j in jobs]
    except AlignError as e:  # a history corrupt before its last line: refused, never read past
        print(f"align: error: {e}", file=sys.stderr)
        return e.exit_code
    print(format_table(rows), flush=True)
    out = args.out or args.dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(rows, indent=2))
    plot(rows, out / "report.png", f"align.tools.report {args.dir.resolve().name}",
         {j.name: loss_points(j) for j in jobs})
    print(f"wrote {out / 'report.json'} and {out / 'report.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
