"""Data pipeline benchmark (not a test): cold encode of bundled GSM8K train, cache-hit load, and
sampling one epoch of 1M records of given lengths.

    PYTHONPATH=. python scripts/bench_data.py [--workers 2] [--records 1000000]

Targets (issue 3): cold encode <= 20 s on 2 cores, cache hit <= 2 s, sampling 1M records <= 2 s.
Writes bench_data.json under $OUT (default ./outputs/bench). Times depend on the machine and its
load: quote them with the date, the machine and whether it was shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2, help="encode worker processes")
    ap.add_argument("--records", type=int, default=1_000_000, help="records to sample")
    args = ap.parse_args()

    from align.config import DataConfig, ModelConfig, SamplerConfig, SamplerKind
    from align.data.encode_cache import load_dataset
    from align.data.samplers import build_sampler
    from align.data.stats import length_moments, plan_stats, root_codes
    from align.data.tokenizer import load_tokenizer

    result: dict = {"machine": platform.node(), "cpus": os.cpu_count(), "load_avg_before": os.getloadavg(),
                    "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    tok, result["tokenizer_load_s"] = timed(lambda: load_tokenizer(ModelConfig()))
    with tempfile.TemporaryDirectory() as cache:
        cfg = DataConfig(root_field="steps", cache_dir=cache, encode_workers=args.workers)
        data, result["cold_encode_s"] = timed(lambda: load_dataset(cfg, ModelConfig(), tok))
        assert data.meta["cache_hit"] is False
        hit, result["cache_hit_load_s"] = timed(lambda: load_dataset(cfg, ModelConfig(), tok))
        assert hit.meta["cache_hit"] is True and np.array_equal(hit.tokens, data.tokens)
    result.update(records=len(data), tokens=int(data.stats["tokens"]), encode_workers=args.workers,
                  **length_moments(data.lengths))

    # 1M records whose lengths follow GSM8K's, with roots, as the sampler sees them.
    rng = np.random.default_rng(0)
    pick = rng.integers(0, len(data), size=args.records)
    lengths = data.lengths[pick]
    codes = root_codes(data.roots)[pick]
    sampling = {}
    for name, kw in (("shuffle", dict(kind=SamplerKind.shuffle)),
                     ("bucket_64", dict(kind=SamplerKind.bucket, bucket_size=64)),
                     ("bucket_all", dict(kind=SamplerKind.bucket, bucket_size=args.records)),
                     ("budget_4096", dict(kind=SamplerKind.budget, bucket_size=512, max_tokens=4096))):
        sampler = build_sampler(SamplerConfig(**kw), lengths, seed=0, rank=0, world=8)
        batches, t_epoch = timed(partial(sampler.global_batches, 0))
        _, t_rank = timed(partial(sampler.rank_batches, 1))
        _, t_plan = timed(partial(plan_stats, sampler, codes, window=8))
        sampling[name] = {"epoch_s": round(t_epoch, 3), "rank_shard_s": round(t_rank, 3),
                          "plan_stats_s": round(t_plan, 3), "micro_batches": len(batches)}
    result["sampling_1M"] = sampling
    result["load_avg_after"] = os.getloadavg()

    print(f"{result['date']} on {result['machine']} ({result['cpus']} CPUs, "
          f"load avg before {result['load_avg_before'][0]:.1f})")
    print(f"GSM8K train: {result['records']} records, {result['tokens']:,} tokens, E[w]={result['E_w']:.1f}, "
          f"E[w^2]/E[w]^2={result['w2_ratio']:.3f}")
    print(f"tokenizer load            {result['tokenizer_load_s']:6.2f} s")
    print(f"cold encode ({args.workers} workers)   {result['cold_encode_s']:6.2f} s   (target <= 20 s)")
    print(f"cache hit load            {result['cache_hit_load_s']:6.2f} s   (target <= 2 s)")
    for name, s in sampling.items():
        print(f"sample {args.records:,} {name:<12} epoch {s['epoch_s']:5.2f} s, rank shard {s['rank_shard_s']:5.2f} s, "
              f"plan stats {s['plan_stats_s']:5.2f} s   (target <= 2 s)")
    out = Path(os.environ.get("OUT", "outputs/bench"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_data.json").write_text(json.dumps(result, indent=2, default=float))


if __name__ == "__main__":
    main()
