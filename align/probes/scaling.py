"""`python -m align.tools.probe probe=scaling`: the 10-minute triage.

Time fwd+bwd of the composed model at >= 3 sequence lengths w (fixed batch, warm-up, best of k), fit

    t(w) = A*w + B*w^2

and read the regime off the fit: per-token work (linear), attention (quadratic) or a fixed per-batch
cost (launch-bound), each with its lever. Three points for two parameters, and the residuals say
whether a third term exists: if the two-term fit closes, a constant term is refuted; if it does not,
a fourth point is needed before anything is concluded. Then predict the real micro-batch from the
shapes the sampler actually forms, E[t] = A*E[w] + B*E[w^2] (never E[w]^2), and check it against
real trainer steps.

The analysis (`fit`, `analyze`, `predict`) is pure and tested on synthetic curves; `run` measures.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from align.config import TrainConfig
from align.errors import ConfigError
from align.plan.planner import Plan

LEVERS = {
    "linear": "per-token work dominates: fewer tokens (padding, bucketing, packing), fused elementwise kernels",
    "quadratic": "attention dominates: the attention backend / kernel "
                 "(read the kernel table: generation, fallback tier)",
    "launch-bound": "a fixed per-batch cost dominates: CUDA graphs, torch.compile, a bigger batch",
}


class FitRefused(ValueError):
    """Fewer distinct lengths than the fit needs to be determined."""


@dataclass
class Fit:
    A: float
    """Seconds per token of width (per batch of fixed rows)."""
    B: float
    """Seconds per token^2."""
    C: float
    """Seconds per batch (0 and not fitted for the two-term model)."""
    with_constant: bool
    ws: list[float]
    ts: list[float]
    rel_residuals: list[float]
    """(fit - measured) / measured at each point."""

    @property
    def max_abs_rel_residual(self) -> float:
        return max(abs(r) for r in self.rel_residuals)

    def t(self, w: float | np.ndarray) -> float | np.ndarray:
        return self.A * w + self.B * w * w + self.C

    def shares(self, w: float) -> dict[str, float]:
        """Fraction of t(w) in each term."""
        total = self.t(w)
        return {"linear": self.A * w / total, "quadratic": self.B * w * w / total, "constant": self.C / total}


def fit(ws: Sequence[float], ts: Sequence[float], constant: bool = False) -> Fit:
    """Least squares in RELATIVE error (each point weighs by 1/t, so a 16x range does not let the
    longest point decide), of t = A*w + B*w^2 (+ C). Needs 3 distinct lengths at least: with two, a
    fit over {linear, quadratic, fixed} has infinitely many solutions."""
    w = np.asarray(ws, dtype=np.float64)
    t = np.asarray(ts, dtype=np.float64)
    if len(w) != len(t):
        raise ValueError(f"{len(w)} lengths but {len(t)} timings")
    distinct = len(set(w.tolist()))
    if distinct < 3:
        raise FitRefused(f"{distinct} distinct lengths: a fit of t(w) from fewer than 3 points is undetermined; "
                         "measure at least 3")
    if np.any(t <= 0):
        raise ValueError("timings must be > 0")
    cols = [w, w * w] + ([np.ones_like(w)] if constant else [])
    X = np.stack(cols, axis=1)
    scale = np.abs(X).max(axis=0)  # conditioning: w^2 is ~1e8 at long lengths
    coef, *_ = np.linalg.lstsq((X / scale) / t[:, None], np.ones_like(t), rcond=None)
    coef = coef / scale
    A, B = float(coef[0]), float(coef[1])
    C = float(coef[2]) if constant else 0.0
    pred = A * w + B * w * w + C
    return Fit(A, B, C, constant, w.tolist(), t.tolist(), ((pred - t) / t).tolist())


def predict(f: Fit, E_w: float, E_w2: float) -> float:
    """Expected time of a batch whose width is distributed with moments E[w], E[w^2]: linear in the
    moments, so E[t] = A*E[w] + B*E[w^2] + C exactly, and E[w^2] is NOT E[w]^2."""
    return f.A * E_w + f.B * E_w2 + f.C


def batch_moments(batches: Sequence[Sequence[tuple[int, int]]], batch_rows: int) -> dict[str, float]:
    """E[w], E[w^2] over micro-batches, each micro-batch a list of (rows, width) segments (one for a
    padded batch, one per document when packed) weighted by rows/batch_rows: the fit is for
    batch_rows rows of width w, so a segment of r rows costs r/batch_rows of t(w), less C."""
    lin = np.array([sum(r * w for r, w in segs) for segs in batches], dtype=np.float64) / batch_rows
    quad = np.array([sum(r * w * w for r, w in segs) for segs in batches], dtype=np.float64) / batch_rows
    rows = np.array([sum(r for r, _ in segs) for segs in batches], dtype=np.float64)
    return {"n": len(batches), "E_w": float(lin.mean()), "E_w2": float(quad.mean()), "mean_rows": float(rows.mean())}


@dataclass
class Analysis:
    points: int
    two_term: Fit
    three_term: Optional[Fit]
    closes: bool
    """The two-term fit's residuals are all within tolerance."""
    constant_check: str
    need_more_points: bool
    confirmed: bool
    """The regime rests on a fit that closed with a spare point (not merely through 3 points with 3 params)."""
    used: str
    """Which fit the regime and prediction use: two_term or three_term."""
    reference: dict[str, float]
    """The width moments the regime is named at (the data's, when known)."""
    shares_at_reference: dict[str, float]
    regime: str
    lever: str
    growth_exponent: float
    """log(t(w_max)/t(w_min)) / log(w_max/w_min): ~0 launch-bound, ~1 linear, ~2 quadratic."""
    messages: list[str] = field(default_factory=list)

    @property
    def fit(self) -> Fit:
        return self.two_term if self.used == "two_term" else self.three_term  # type: ignore[return-value]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("two_term", "three_term"):
            f = getattr(self, k)
            if f is not None:
                d[k]["max_abs_rel_residual"] = f.max_abs_rel_residual
                d[k]["quadratic_share"] = {str(int(w)): f.shares(w)["quadratic"] for w in f.ws}
        return d


def analyze(ws: Sequence[float], ts: Sequence[float], tol: float = 0.01,
            reference: Optional[dict[str, float]] = None) -> Analysis:
    """Fit, check the constant term, name the regime at `reference` ({E_w, E_w2}; default: the
    longest measured width) with its lever. Refuses fewer than 3 distinct lengths."""
    two = fit(ws, ts)
    n = len(set(float(w) for w in ws))
    three = fit(ws, ts, constant=True)
    wmin, wmax = min(ws), max(ws)
    msgs: list[str] = []
    closes = two.max_abs_rel_residual <= tol
    need_more = False
    if closes:
        used, confirmed = "two_term", True
        check = (f"C not needed: the two-term fit closes (max |residual| {two.max_abs_rel_residual:.2%} <= "
                 f"{tol:.0%}), so there is no meaningful fixed per-batch cost: launch-bound is refuted")
        if n >= 4:
            check += f"; with C the residual is {three.max_abs_rel_residual:.2%} (C = {three.C * 1e3:.3f} ms)"
    elif n == 3:
        used, confirmed, need_more = "three_term", False, True
        check = (f"the two-term fit does NOT close (max |residual| {two.max_abs_rel_residual:.2%} > {tol:.0%}): "
                 f"a third term is present. Three parameters through three points always fit, so nothing checks them: "
                 f"measure a 4th length (e.g. w={int(2 * wmax)} or w={max(1, int(wmin // 2))}) before concluding")
        msgs.append("NEED A 4TH POINT: " + check)
    else:
        closes3 = three.max_abs_rel_residual <= tol
        used = "three_term"
        confirmed = closes3
        if closes3:
            check = (f"C earns its place: with C = {three.C * 1e3:.3f} ms per batch the fit closes "
                     f"(max |residual| {three.max_abs_rel_residual:.2%}) where the two-term fit did not "
                     f"({two.max_abs_rel_residual:.2%})")
        else:
            need_more = True
            check = (f"neither fit closes (two-term {two.max_abs_rel_residual:.2%}, with C "
                     f"{three.max_abs_rel_residual:.2%} > {tol:.0%}): noisy timings (raise probe.scaling.repeats) or "
                     f"another term (recompilation, memory pressure); do not conclude from this curve")
            msgs.append("UNRESOLVED: " + check)
    f = two if used == "two_term" else three
    ref = dict(reference) if reference else {"E_w": float(wmax), "E_w2": float(wmax) ** 2}
    parts = {"linear": f.A * ref["E_w"], "quadratic": f.B * ref["E_w2"], "constant": f.C}
    total = sum(parts.values())
    shares = {k: v / total for k, v in parts.items()}
    key = max(parts, key=lambda k: parts[k])
    regime = "launch-bound" if key == "constant" else key
    t_at = lambda x: min(t for w, t in zip(ws, ts) if w == x)  # noqa: E731  (best timing at a width)
    growth = math.log(t_at(wmax) / t_at(wmin)) / math.log(wmax / wmin)
    negative = [k for k, v in (("A", f.A), ("B", f.B), ("C", f.C)) if v < 0]
    if negative:
        msgs.append(f"negative coefficient(s) {', '.join(negative)}: not a physical cost; the timings are noisy or the "
                    "model is wrong over this range (shares above 100% follow from it)")
    if not confirmed:
        msgs.append(f"regime '{regime}' is TENTATIVE: it rests on a fit nothing checked")
    return Analysis(n, two, three, closes, check, need_more, confirmed, used, ref, shares, regime, LEVERS[regime],
                    growth, msgs)


# ------------------------------------------------------------------------------------------- run


def run(cfg: TrainConfig, out_dir: Path, plan: Optional[Plan] = None) -> int:
    import torch

    from align.data.stats import length_moments
    from align.probes.common import (
        LOSS_CAVEAT,
        Instrument,
        build_trainer,
        fixed_width_batch,
        model_summary,
        sampled_segments,
        sync,
        time_forward_backward,
        train_step,
        write_json,
    )
    from align.telemetry.throughput import rates

    pc = cfg.probe.scaling
    trainer = build_trainer(cfg, out_dir, plan)
    device = trainer.env.device
    rows = pc.batch_size or cfg.sampler.micro_batch_size
    lengths = sorted(set(pc.lengths))
    max_pos = getattr(trainer.model.config, "max_position_embeddings", None)
    if max_pos and max(lengths) > max_pos:
        raise ConfigError("probe.scaling.lengths", f"longest length {max(lengths)} exceeds the model's "
                          f"max_position_embeddings={max_pos} "
                          f"(raise it with +model.overrides.max_position_embeddings=)",
                          lengths)
    print(f"scaling probe: {model_summary(trainer)['model_class']} on {device}, batch {rows} rows, "
          f"lengths {lengths}, warm-up {pc.warmup}, best of {pc.repeats}", flush=True)

    points = []
    for w in lengths:
        batch = fixed_width_batch(trainer.data, rows, w, trainer.tokenizer.pad_token_id).to(device)
        try:
            r = time_forward_backward(trainer, batch, pc.warmup, pc.repeats)
        except torch.OutOfMemoryError:
            trainer.model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            print(f"  w={w}: out of memory at {rows} rows; point dropped", flush=True)
            points.append({"w": w, "rows": rows, "oom": True})
            continue
        points.append({"w": w, "rows": rows, "tokens": rows * w, "oom": False, **r,
                       "ce_forward_fraction": r["ce_forward_s"] / r["best_s"]})
        print(f"  w={w:>6}: best {r['best_s'] * 1e3:10.3f} ms of {[round(x * 1e3, 3) for x in r['all_s']]}, "
              f"CE forward {r['ce_forward_s'] * 1e3:.3f} ms", flush=True)
    ok = [p for p in points if not p["oom"]]
    if len(ok) < 3:
        raise ConfigError("probe.scaling.lengths", f"only {len(ok)} lengths ran (others out of memory); a fit needs 3: "
                          "use shorter lengths or a smaller probe.scaling.batch_size", lengths)

    sampled = batch_moments(sampled_segments(trainer), rows)
    rows_moments = length_moments(trainer.data.lengths)
    a = analyze([p["w"] for p in ok], [p["best_s"] for p in ok], pc.residual_tol, sampled)
    f = a.fit
    pred_sampled = predict(f, sampled["E_w"], sampled["E_w2"])
    # The same rows without padding: a row of length w costs (A*w + B*w^2)/rows.
    k = sampled["mean_rows"] / rows
    pred_unpadded = predict(f, rows_moments["E_w"] * k, rows_moments["E_w2"] * k)

    # Real steps on the real stream: one warm-up, then measure_steps with fwd+bwd and CE timed inside.
    batches = iter(trainer.stream)
    train_step(trainer, batches)
    steps, fb, ce, seen = [], [], [], []
    with Instrument(trainer) as inst:
        for _ in range(pc.measure_steps):
            sync(device)
            m = train_step(trainer, batches)
            got = inst.take()
            steps.append(m)
            fb += got["fwd_bwd_s"]
            ce.append(sum(got["ce_forward_s"]))
            seen += got["segments"]
    step_s = float(np.mean([m["step_time_s"] for m in steps]))
    seen_m = batch_moments(seen, rows)
    fb_pred_seen = len(seen) * predict(f, seen_m["E_w"], seen_m["E_w2"])
    measured = {
        "steps": pc.measure_steps,
        "step_s_mean": step_s,
        "fwd_bwd_s_sum": float(sum(fb)),
        "fwd_bwd_s_predicted_same_batches": fb_pred_seen,
        "fwd_bwd_measured_over_predicted": float(sum(fb)) / fb_pred_seen,
        "outside_fwd_bwd_s_per_step": step_s - float(sum(fb)) / pc.measure_steps,
        "ce_forward_s_per_step": float(np.mean(ce)),
        "ce_forward_fraction_of_step": float(np.mean(ce)) / step_s,
        "ce_caveat": LOSS_CAVEAT,
        "segments": seen,
        "throughput": rates(sum(m["tokens"] for m in steps), sum(m["real_tokens"] for m in steps),
                            sum(m["loss_tokens"] for m in steps), sum(m["model_flops"] for m in steps),
                            sum(m["step_time_s"] for m in steps),
                            trainer.throughput.ceiling, trainer.throughput.datasheet_tflops),
    }
    prediction = {
        "fit_batch_rows": rows,
        "sampled_batches": sampled,
        "records": rows_moments,
        "fwd_bwd_per_micro_batch_s": pred_sampled,
        "fwd_bwd_per_micro_batch_unpadded_s": pred_unpadded,
        "padding_tax": pred_sampled / pred_unpadded - 1,
        "step_s_predicted_fwd_bwd_only": cfg.trainer.grad_accum * pred_sampled,
        "step_s_predicted_plus_measured_overhead":
            cfg.trainer.grad_accum * pred_sampled + measured["outside_fwd_bwd_s_per_step"],
        "step_s_measured": step_s,
    }
    report = {
        "probe": "scaling",
        "model": model_summary(trainer),
        "throughput_convention": trainer.throughput.describe(),
        "config": {"lengths": lengths, "batch_rows": rows, "warmup": pc.warmup, "repeats": pc.repeats,
                   "residual_tol": pc.residual_tol},
        "points": points,
        "analysis": a.to_dict(),
        "prediction": prediction,
        "measured": measured,
    }
    write_json(out_dir / "scaling.json", report)
    text = format_report(report, a)
    (out_dir / "scaling.md").write_text(text)
    print(text, flush=True)
    plot(a, ok, out_dir / "scaling.png")
    trainer.history.close()
    print(f"wrote {out_dir / 'scaling.json'}, scaling.md, scaling.png", flush=True)
    return 0


def format_report(report: dict[str, Any], a: Analysis) -> str:
    from align.telemetry.throughput import format_mfu

    f = a.fit
    lines = ["# scaling probe", "",
             f"model {report['model']['model_class']} ({report['model']['attn_implementation_resolved']}), "
             f"{report['model']['device_name']}, batch {report['config']['batch_rows']} rows", "",
             "| w | best ms | fit ms | residual | quadratic share | CE fwd ms | CE fwd / fwd+bwd |",
             "|---|---|---|---|---|---|---|"]
    for p in report["points"]:
        if p["oom"]:
            lines.append(f"| {p['w']} | OOM | | | | | |")
            continue
        w = p["w"]
        fit_t = f.t(w)
        lines.append(f"| {w} | {p['best_s'] * 1e3:.3f} | {fit_t * 1e3:.3f} | "
                     f"{(fit_t - p['best_s']) / p['best_s']:+.2%} | {f.shares(w)['quadratic']:.1%} | "
                     f"{p['ce_forward_s'] * 1e3:.3f} | {p['ce_forward_fraction']:.1%} |")
    pr, me = report["prediction"], report["measured"]
    th = me["throughput"]
    lines += [
        "",
        f"fit ({a.used.replace('_', '-')}): A = {f.A:.4e} s/token, B = {f.B:.4e} s/token^2" +
        (f", C = {f.C:.4e} s" if f.with_constant else "") +
        f"; two-term max |residual| {a.two_term.max_abs_rel_residual:.2%}",
        f"constant term: {a.constant_check}",
        f"growth exponent t ~ w^{a.growth_exponent:.2f} over the measured range",
        f"regime at the data's micro-batch widths (E[w]={a.reference['E_w']:.1f}, E[w^2]={a.reference['E_w2']:.1f}): "
        f"{a.regime.upper()}{'' if a.confirmed else ' (TENTATIVE)'} "
        f"(linear {a.shares_at_reference['linear']:.1%}, quadratic {a.shares_at_reference['quadratic']:.1%}, "
        f"constant {a.shares_at_reference['constant']:.1%})",
        f"lever: {a.lever}",
        *[f"!! {m}" for m in a.messages],
        "",
        "## prediction from the data's length distribution: E[t] = A*E[w] + B*E[w^2] (+ C)",
        f"records: E[w]={pr['records']['E_w']:.1f}, E[w^2]={pr['records']['E_w2']:.1f}, "
        f"E[w^2]/E[w]^2={pr['records']['w2_ratio']:.3f}",
        f"fwd+bwd per micro-batch, as sampled (padded rows or packed documents): "
        f"{pr['fwd_bwd_per_micro_batch_s'] * 1e3:.3f} ms; "
        f"same rows unpadded: {pr['fwd_bwd_per_micro_batch_unpadded_s'] * 1e3:.3f} ms "
        f"(padding tax {pr['padding_tax']:+.1%})",
        f"measured on {len(me['segments'])} real micro-batches: fwd+bwd {me['fwd_bwd_s_sum'] * 1e3:.3f} ms "
        f"vs predicted "
        f"{me['fwd_bwd_s_predicted_same_batches'] * 1e3:.3f} ms for the same shapes "
        f"(measured/predicted {me['fwd_bwd_measured_over_predicted']:.3f}; real batches with padding carry a mask, "
        f"the fit's batches do not)",
        f"step: predicted {pr['step_s_predicted_plus_measured_overhead'] * 1e3:.3f} ms "
        f"(fwd+bwd {pr['step_s_predicted_fwd_bwd_only'] * 1e3:.3f} + measured optimizer/other "
        f"{me['outside_fwd_bwd_s_per_step'] * 1e3:.3f}), measured {me['step_s_mean'] * 1e3:.3f} ms",
        f"CE forward {me['ce_forward_s_per_step'] * 1e3:.3f} ms = {me['ce_forward_fraction_of_step']:.2%} of the step. "
        f"Caveat: {me['ce_caveat']}",
        "",
        "## throughput of the measured steps",
        f"tokens/s {th['tokens_per_s']:,.0f}, real tokens/s {th['real_tokens_per_s']:,.0f}, loss tokens/s "
        f"{th['loss_tokens_per_s']:,.0f}, model FLOPs/token {th['flops_per_token']:,.0f}, achieved "
        f"{th['achieved_tflops']:.3f} TFLOP/s; MFU: {format_mfu(th)}",
        f"FLOPs convention: {report['throughput_convention']['flops']['convention']}",
    ]
    return "\n".join(lines) + "\n"


def plot(a: Analysis, points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f = a.fit
    ws = np.array([p["w"] for p in points], dtype=float)
    ts = np.array([p["best_s"] for p in points]) * 1e3
    grid = np.linspace(0, ws.max() * 1.05, 200)
    fig, (ax, axr) = plt.subplots(2, 1, figsize=(7, 7), height_ratios=[3, 1], sharex=True)
    ax.plot(ws, ts, "o", color="k", label="measured (best of k)")
    ax.plot(grid, f.t(grid) * 1e3, "-", label=f"fit ({a.used.replace('_', '-')})")
    ax.plot(grid, f.A * grid * 1e3, "--", label="A*w (linear)")
    ax.plot(grid, f.B * grid * grid * 1e3, ":", label="B*w^2 (quadratic)")
    if f.with_constant:
        ax.axhline(f.C * 1e3, color="gray", lw=0.8, label="C (constant)")
    ax.set_ylabel("fwd+bwd time per batch (ms)")
    ax.set_title(f"regime: {a.regime}{'' if a.confirmed else ' (tentative)'}")
    ax.legend()
    axr.axhline(0, color="gray", lw=0.8)
    axr.plot(ws, np.array(a.two_term.rel_residuals) * 100, "o-", label="two-term")
    if a.three_term is not None:
        axr.plot(ws, np.array(a.three_term.rel_residuals) * 100, "s--", label="with C")
    axr.set_xlabel("sequence length w (tokens)")
    axr.set_ylabel("residual %")
    axr.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
