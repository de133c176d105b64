"""Data stats: E[w], E[w^2]/E[w]^2, padding waste, zero-pad fraction, roots per window, on cases
small enough to check by hand; and the per-step accumulator the trainer calls."""

from __future__ import annotations

import numpy as np
import pytest

from align.data.samplers import ShuffleSampler, padding_stats
from align.data.stats import DataStats, length_moments, plan_stats, root_codes, roots_per_window
from tests.unit.data.test_loader import synthetic


def test_length_moments_weigh_the_long_tail():
    m = length_moments(np.array([100, 100, 100, 1000]))
    assert m["E_w"] == 325 and m["E_w2"] == (3 * 100**2 + 1000**2) / 4
    assert m["w2_ratio"] == pytest.approx(m["E_w2"] / 325**2) and m["w2_ratio"] > 2


def test_padding_stats_by_hand():
    lengths = np.array([4, 4, 2, 8])
    batches = [np.array([0, 1]), np.array([2, 3])]
    s = padding_stats(batches, lengths)
    # batch 0: 8 computed / 8 real; batch 1: 16 computed / 10 real
    assert s["pad_waste"] == pytest.approx(6 / 24) and s["zero_pad_frac"] == 0.5 and s["max_batch_tokens"] == 16
    r = padding_stats(batches, lengths, pad_to_multiple_of=8)
    assert r["pad_waste"] == pytest.approx(1 - 18 / 32) and r["zero_pad_frac"] == 0.0
    p = padding_stats(batches, lengths, packed=True)
    assert p["pad_waste"] == 0.0 and p["zero_pad_frac"] == 1.0 and p["max_batch_tokens"] == 10


def test_roots_per_window_by_hand():
    codes = root_codes(["a", "a", "b", "c", "c", "d"])
    batches = [np.array([0, 1]), np.array([2, 3]), np.array([4, 5])]
    assert roots_per_window(batches, codes, window=1) == pytest.approx((1 + 2 + 2) / 3)
    assert roots_per_window(batches, codes, window=2) == 3  # one whole window {a, b, c}; the tail is left out
    assert roots_per_window(batches, codes, window=5) == 4  # no whole window: the partial one counts


def test_plan_compares_with_a_pure_shuffle():
    data = synthetic(200)
    sampler = ShuffleSampler(data.lengths, 4, 0)
    plan = plan_stats(sampler, root_codes(data.roots), window=2)
    assert plan["roots_per_window"] == plan["shuffle_roots_per_window"]  # a shuffle is its own baseline
    assert plan["micro_batches"] == 50 and 0 < plan["pad_waste"] < 1


def test_data_stats_step_and_summary():
    from align.data.collate import collate

    data = synthetic(20)
    data.stats.update(truncated=2, dropped_too_long=1)
    ds = DataStats(data, {"pad_waste": 0.1, "shuffle_roots_per_window": 3.0})
    window = [collate(data, np.array([0, 1, 2]), 0), collate(data, np.array([5]), 0)]
    row = ds.step(window)
    real = sum(b.real_tokens for b in window)
    tokens = sum(b.tokens for b in window)
    assert row == {"pad_waste": pytest.approx(1 - real / tokens), "zero_pad_frac": 0.5,
                   "roots_in_window": len({data.roots[i] for i in (0, 1, 2, 5)})}
    s = ds.summary()
    assert s["pad_waste"] == row["pad_waste"] and s["plan_pad_waste"] == 0.1 and s["shuffle_roots_per_window"] == 3.0
    assert s["truncated"] == 2 and s["dropped_too_long"] == 1 and "w2_ratio" in s and "E_w" in s


def test_sampler_stats_for_the_manifest_are_this_ranks_epoch_0_plus_the_global_plan():
    from align.config import SamplerConfig, SamplerKind
    from align.data.samplers import build_sampler

    data = synthetic(203)
    s = build_sampler(SamplerConfig(kind=SamplerKind.bucket, micro_batch_size=4, bucket_size=32), data.lengths, 0, 1, 2)
    s.plan = plan_stats(s, root_codes(data.roots), window=2)
    st = s.stats()
    assert st["kind"] == "bucket" and st["micro_batches_per_epoch"] == len(s.rank_batches(0)) == 25
    assert st["global"]["micro_batches"] == 51 and st["global"]["dropped_by_rank_trim"] == 1
    assert 0 <= st["padding_waste_epoch0"] < 1 and "shuffle_roots_per_window" in st["global"]
