"""Data-side measurements: padding waste, zero-pad micro-batches, roots per accumulation window and
the length moments E[w], E[w^2] (docs/triage.md#3, docs/triage.md#4).

The functions are pure (arrays in, numbers out) so the padding probe, the scaling probe and the
trainer share them. `DataStats` is the trainer's accumulator: one dict per optimizer step for
history, one for the run summary.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from align.data.samplers import MicroBatchSampler, padding_stats


def length_moments(lengths: np.ndarray) -> dict[str, float]:
    """E[w], E[w^2] and E[w^2]/E[w]^2 of the record lengths: the quadratic (attention) term of a
    step is weighted by E[w^2], not E[w]^2 (docs/triage.md#3)."""
    w = np.asarray(lengths, dtype=np.float64)
    e_w, e_w2 = float(w.mean()), float((w * w).mean())
    return {"E_w": e_w, "E_w2": e_w2, "w2_ratio": e_w2 / (e_w * e_w)}


def root_codes(roots: Sequence[str]) -> np.ndarray:
    """Roots as small integers (vectorised counting)."""
    _, codes = np.unique(np.asarray(roots, dtype=object).astype(str), return_inverse=True)
    return codes.astype(np.int64)


def roots_per_window(batches: Sequence[np.ndarray], codes: np.ndarray, window: int) -> float:
    """Mean number of distinct roots over windows of `window` consecutive micro-batches (an
    accumulation window: grad_accum x world micro-batches of the global order). A trailing partial
    window counts only when there is no whole one."""
    if not len(batches):
        return 0.0
    n_win = max(1, len(batches) // window)
    used = batches[: n_win * window] if len(batches) >= window else batches
    sizes = np.array([len(b) for b in used])
    win_of_row = np.repeat(np.arange(len(used)) // window, sizes)
    rows = np.concatenate(list(used))
    pairs = np.unique(win_of_row * (int(codes.max()) + 1) + codes[rows])
    return float(np.bincount(pairs // (int(codes.max()) + 1)).mean())


def plan_stats(sampler: MicroBatchSampler, codes: np.ndarray, window: int, epoch: int = 0) -> dict[str, Any]:
    """What the sampler will do over one epoch (the global order, before rank sharding), beside a
    pure shuffle with the same rows per micro-batch and the same window."""
    batches = sampler.global_batches(epoch)
    out = padding_stats(batches, sampler.lengths, sampler.pad_to_multiple_of, sampler.packed)
    out["roots_per_window"] = roots_per_window(batches, codes, window)
    mbs = max(1, int(round(out["mean_rows"])))
    baseline = sampler.shuffle_baseline(mbs).global_batches(epoch)
    out["shuffle_roots_per_window"] = roots_per_window(baseline, codes, window)
    out["window"] = window
    out["dropped_by_rank_trim"] = len(batches) % sampler.world
    return out


class DataStats:
    """Per-step data stats for history and their run totals for the summary."""

    def __init__(self, data, plan: dict[str, Any]) -> None:
        self.codes = root_codes(data.roots)
        self.plan = plan
        self.moments = length_moments(data.lengths)
        self.data_meta = {k: data.stats.get(k, 0)
                          for k in ("truncated", "dropped_too_long", "dropped_no_loss", "skipped_bad")}
        self.data_meta["encode_cache_hit"] = data.meta.get("cache_hit")
        self.data_meta["encode_cache_key"] = data.meta.get("encode_cache_key")
        self.micro_batches = self.zero_pad = self.tokens = self.real = 0
        self.windows = 0
        self.roots_sum = 0

    def step(self, window: Sequence[Any]) -> dict[str, Any]:
        """Stats of one accumulation window of Batches (this rank's)."""
        tokens = sum(b.tokens for b in window)
        real = sum(b.real_tokens for b in window)
        zero = sum(b.tokens == b.real_tokens for b in window)
        roots = len(np.unique(self.codes[np.concatenate([b.rows for b in window])]))
        self.micro_batches += len(window)
        self.zero_pad += zero
        self.tokens += tokens
        self.real += real
        self.windows += 1
        self.roots_sum += roots
        return {"pad_waste": 1.0 - real / tokens, "zero_pad_frac": zero / len(window), "roots_in_window": roots}

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.windows:
            out.update(pad_waste=1.0 - self.real / self.tokens, zero_pad_frac=self.zero_pad / self.micro_batches,
                       roots_per_window=self.roots_sum / self.windows)
        out.update({f"plan_{k}": v for k, v in self.plan.items() if k != "shuffle_roots_per_window"})
        out["shuffle_roots_per_window"] = self.plan.get("shuffle_roots_per_window")
        out.update(self.moments)
        out.update(self.data_meta)
        return out


def sampler_stats(stream: Any) -> dict[str, Any]:
    """Padding and shape of epoch 0 as this rank's sampler cuts it (numpy only, no collate)."""
    sampler = stream.sampler
    own = getattr(sampler, "stats", None)
    if callable(own):  # the data engineer's sampler may report richer stats (roots per window)
        return dict(own())
    lengths = np.asarray(stream.data.lengths)
    mult = int(getattr(stream, "mult", 1) or 1)
    batches = sampler.rank_batches(0)
    real = padded = zero = 0
    for rows in batches:
        ls = lengths[rows]
        width = -(-int(ls.max()) // mult) * mult
        real += int(ls.sum())
        padded += width * len(rows)
        zero += int(width * len(rows) == int(ls.sum()))
    return {"micro_batches_per_epoch": len(batches), "real_tokens_epoch0": real, "padded_tokens_epoch0": padded,
            "padding_waste_epoch0": 1 - real / padded if padded else None,
            "zero_pad_fraction_epoch0": zero / len(batches) if batches else None}
