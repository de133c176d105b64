"""`python -m align.tools.probe probe=padding`: the bucket sweep from the data alone.

For a pure shuffle and each bucket size: padding waste (padded tokens / all tokens), the fraction
of micro-batches with zero padding (they run without a mask, on SDPA's is_causal path), roots per
accumulation window (diversity), and the largest micro-batch in tokens. Same encode cache, sampler
and statistics code as training, so it measures what a run would do. Prints a table and writes
padding.json and padding.png into the probe's run dir.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from align.config import SamplerKind, TrainConfig
from align.data.encode_cache import load_dataset
from align.data.samplers import build_sampler
from align.data.sources import source_specs
from align.data.stats import length_moments, plan_stats, root_codes
from align.data.tokenizer import load_tokenizer

log = logging.getLogger("align")


def sweep(data, cfg: TrainConfig, bucket_sizes: list[int], window: int) -> list[dict[str, Any]]:
    """One row per sampler setting: shuffle, then each bucket size (0: the whole data set)."""
    codes = root_codes(data.roots)
    mixture = (data.source_index, [s.weight for s in source_specs(cfg.data)])
    kind = SamplerKind.budget if cfg.sampler.kind == SamplerKind.budget else SamplerKind.bucket
    settings = [("shuffle", None)] + [(kind.value, b) for b in bucket_sizes]
    rows = []
    for name, bucket in settings:
        scfg = dataclasses.replace(cfg.sampler, kind=SamplerKind(name), packed=False,
                                   bucket_size=len(data) if bucket == 0 else (bucket or cfg.sampler.bucket_size))
        sampler = build_sampler(scfg, data.lengths, cfg.trainer.seed, mixture=mixture)
        stats = plan_stats(sampler, codes, window)
        rows.append({"sampler": name, "bucket_size": None if bucket is None else ("all" if bucket == 0 else bucket),
                     **{k: stats[k] for k in ("pad_waste", "zero_pad_frac", "roots_per_window", "max_batch_tokens",
                                              "micro_batches", "mean_rows", "shuffle_roots_per_window")}})
    return rows


def format_table(rows: list[dict[str, Any]], header: dict[str, Any]) -> str:
    lines = [", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in header.items()),
             f"{'sampler':<8} {'bucket':>6} {'padding waste':>13} {'zero-pad mb':>11} {'roots/window':>12} "
             f"{'max mb tokens':>13} {'micro-batches':>13}"]
    for r in rows:
        lines.append(f"{r['sampler']:<8} {str(r['bucket_size'] or '-'):>6} {100 * r['pad_waste']:>12.1f}% "
                     f"{100 * r['zero_pad_frac']:>10.1f}% {r['roots_per_window']:>12.2f} {r['max_batch_tokens']:>13,} "
                     f"{r['micro_batches']:>13,}")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shuffle = rows[0]
    buckets = rows[1:]
    labels = [str(r["bucket_size"]) for r in buckets]
    x = range(len(buckets))
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(x, [100 * r["pad_waste"] for r in buckets], "o-", label="padding waste (bucket)")
    a.plot(x, [100 * r["zero_pad_frac"] for r in buckets], "s-", label="zero-pad micro-batches (bucket)")
    a.axhline(100 * shuffle["pad_waste"], ls="--", c="C0", label="padding waste (shuffle)")
    a.axhline(100 * shuffle["zero_pad_frac"], ls=":", c="C1", label="zero-pad micro-batches (shuffle)")
    a.set(xticks=list(x), xticklabels=labels, xlabel="bucket size (records)", ylabel="%", title="padding")
    a.legend(fontsize=7)
    b.plot(x, [r["roots_per_window"] for r in buckets], "o-", label="bucket")
    b.axhline(shuffle["roots_per_window"], ls="--", c="k", label="shuffle")
    # From zero: a zoomed axis would make a 0.1-root difference look like a collapse.
    b.set(xticks=list(x), xticklabels=labels, xlabel="bucket size (records)", ylabel="distinct roots",
          title="roots per window",
          ylim=(0, 1.15 * max(r["roots_per_window"] for r in rows)))
    b.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(cfg: TrainConfig, out_dir: Path) -> int:
    from align.parallel.env import resolve_device
    from align.plan.budget_auto import plan_sizes

    cfg, _ = plan_sizes(cfg, resolve_device(cfg.trainer.device))  # the budget a run on this device takes
    tokenizer = load_tokenizer(cfg.model)
    data = load_dataset(cfg.data, cfg.model, tokenizer)
    window = cfg.probe.padding.window or cfg.trainer.grad_accum
    rows = sweep(data, cfg, list(cfg.probe.padding.bucket_sizes), window)
    header = {"records": len(data), "roots": len(set(data.roots)), "micro_batch_size": cfg.sampler.micro_batch_size,
              "window": window, "pad_to_multiple_of": cfg.sampler.pad_to_multiple_of,
              "max_seq_len": cfg.data.max_seq_len,
              **length_moments(data.lengths)}
    if cfg.sampler.kind == SamplerKind.budget:
        header["max_tokens"] = cfg.sampler.max_tokens
    table = format_table(rows, header)
    print(table, flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"header": header, "rows": rows, "encode_cache_key": data.meta.get("encode_cache_key"),
              "sources": data.meta.get("sources")}
    (out_dir / "padding.json").write_text(json.dumps(result, indent=2))
    plot(rows, out_dir / "padding.png", table.splitlines()[0])
    log.info("padding probe: wrote %s and %s", out_dir / "padding.json", out_dir / "padding.png")
    return 0
