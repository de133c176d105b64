"""Samplers: deterministic from (seed, epoch), every row once per epoch, disjoint rank shards with
equal micro-batch counts, tight pairing in buckets, the global shuffle that restores diversity, the
token budget, and mixture weights."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from align.config import SamplerConfig, SamplerKind
from align.data.samplers import BucketSampler, BudgetSampler, ShuffleSampler, build_sampler, padded_len, padding_stats
from align.data.stats import roots_per_window
from align.errors import ConfigError

RNG = np.random.default_rng(7)
LENGTHS = RNG.integers(5, 400, size=1003)


def _all(cfg_kw, lengths=LENGTHS, seed=3, rank=0, world=1, mixture=None):
    return build_sampler(SamplerConfig(**cfg_kw), lengths, seed, rank, world, mixture=mixture)


KINDS = [dict(kind=SamplerKind.shuffle), dict(kind=SamplerKind.bucket, bucket_size=64),
         dict(kind=SamplerKind.budget, bucket_size=64, max_tokens=1600)]
IDS = ["shuffle", "bucket", "budget"]


@pytest.mark.parametrize("kw", KINDS, ids=IDS)
def test_deterministic_from_seed_and_epoch(kw):
    a, b = _all(kw).global_batches(1), _all(kw).global_batches(1)
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    other_epoch = _all(kw).global_batches(2)
    other_seed = _all(kw, seed=4).global_batches(1)
    assert not all(np.array_equal(x, y) for x, y in zip(a, other_epoch))
    assert not all(np.array_equal(x, y) for x, y in zip(a, other_seed))


@pytest.mark.parametrize("kw", KINDS, ids=IDS)
def test_every_row_exactly_once_per_epoch(kw):
    rows = np.concatenate(_all(kw).global_batches(0))
    assert np.array_equal(np.sort(rows), np.arange(len(LENGTHS)))


@pytest.mark.parametrize("kw", KINDS, ids=IDS)
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_draw_disjoint_rows_and_equal_micro_batch_counts(kw, world):
    shards = [_all(kw, rank=r, world=world).rank_batches(5) for r in range(world)]
    assert len({len(s) for s in shards}) == 1
    rows = [np.concatenate(s) for s in shards]
    union = np.concatenate(rows)
    assert len(union) == len(np.unique(union)), "a row was drawn by two ranks"
    g = _all(kw, world=world).global_batches(5)
    assert len(shards[0]) == len(g) // world and len(g) - world < len(shards[0]) * world <= len(g)


def test_bucket_pairs_neighbours_and_a_full_sort_leaves_almost_no_padding():
    shuffle = padding_stats(_all(dict(kind=SamplerKind.shuffle)).global_batches(0), LENGTHS)
    b64 = padding_stats(_all(dict(kind=SamplerKind.bucket, bucket_size=64)).global_batches(0), LENGTHS)
    full = _all(dict(kind=SamplerKind.bucket, bucket_size=len(LENGTHS)))
    batches = full.global_batches(0)
    s_full = padding_stats(batches, LENGTHS)
    assert shuffle["pad_waste"] > 0.3 > b64["pad_waste"] > s_full["pad_waste"]
    # A full sort: every micro-batch spans a contiguous range of the sorted lengths.
    srt = np.sort(LENGTHS)
    for rows in batches:
        lo, hi = LENGTHS[rows].min(), LENGTHS[rows].max()
        assert np.count_nonzero((srt > lo) & (srt < hi)) <= len(rows) - 2 if len(rows) > 1 else True
    # ... and the micro-batches are shuffled globally, not served in length order.
    means = np.array([LENGTHS[r].mean() for r in batches])
    assert not (np.all(np.diff(means) >= 0) or np.all(np.diff(means) <= 0))
    assert abs(np.corrcoef(np.arange(len(means)), means)[0, 1]) < 0.3


def test_the_global_shuffle_restores_root_diversity():
    # Roots correlate with length (as sources do): sorting makes micro-batches root-homogeneous;
    # the global micro-batch shuffle must bring windows back near a pure shuffle.
    lengths = np.concatenate([RNG.integers(10 + 40 * k, 50 + 40 * k, size=200) for k in range(8)])
    codes = np.repeat(np.arange(8), 200)
    full = BucketSampler(lengths, 4, 0, bucket_size=len(lengths))
    shuffle = ShuffleSampler(lengths, 4, 0)
    r_full = roots_per_window(full.global_batches(0), codes, window=8)
    r_shuffle = roots_per_window(shuffle.global_batches(0), codes, window=8)
    sorted_order = full.cut(full.sorted_buckets(full._rng(0)))  # the same micro-batches, unshuffled
    r_unshuffled = roots_per_window(sorted_order, codes, window=8)
    # Each sorted micro-batch holds one root, so a window of 8 randomly drawn ones holds
    # 8 * (1 - (7/8)^8) = 5.25 roots in expectation; unshuffled, a window spans one or two roots.
    assert r_unshuffled < 2.5 and abs(r_full - 8 * (1 - (7 / 8) ** 8)) < 0.4 and r_shuffle > 7.5


def test_micro_batches_keep_their_size_whatever_the_bucket_size():
    for bucket in (2, 3, 8, 50, 5000):
        sampler = _all(dict(kind=SamplerKind.bucket, bucket_size=bucket, micro_batch_size=8))
        sizes = {len(b) for b in sampler.global_batches(0)}
        assert sizes <= {8, len(LENGTHS) % 8}


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("mult", [1, 16])
def test_budget_keeps_every_micro_batch_within_max_tokens(packed, mult):
    s = _all(dict(kind=SamplerKind.budget, bucket_size=128, max_tokens=1600, pad_to_multiple_of=mult, packed=packed))
    batches = s.global_batches(0)
    for rows in batches:
        plen = padded_len(LENGTHS[rows], mult)
        cost = padded_len(int(LENGTHS[rows].sum()), mult) if packed else len(rows) * plen.max()
        assert cost <= 1600 or len(rows) == 1
    # It fills the budget: far fewer micro-batches than one row each, and some with many rows.
    assert len(batches) < len(LENGTHS) / 2 and max(len(b) for b in batches) >= 8


def test_budget_must_hold_the_longest_record():
    with pytest.raises(ConfigError, match="longest record"):
        _all(dict(kind=SamplerKind.budget, max_tokens=int(LENGTHS.max()) - 1))
    with pytest.raises(ConfigError):
        SamplerConfig(kind=SamplerKind.budget)  # max_tokens is required


def test_mixture_weights_repeat_or_subsample_each_source_per_epoch():
    source = np.repeat([0, 1, 2], [300, 400, 303])
    s = build_sampler(SamplerConfig(kind=SamplerKind.bucket, bucket_size=64), LENGTHS, 0,
                      mixture=(source, [2.0, 0.5, 1.0]))
    e0, e1 = np.concatenate(s.global_batches(0)), np.concatenate(s.global_batches(1))
    counts = np.bincount(e0, minlength=len(LENGTHS))
    assert set(counts[:300]) == {2} and set(counts[700:]) == {1}
    half0, half1 = set(e0[(e0 >= 300) & (e0 < 700)]), set(e1[(e1 >= 300) & (e1 < 700)])
    assert len(half0) == len(half1) == 200 and half0 != half1  # a fresh half each epoch
    again = np.concatenate(build_sampler(SamplerConfig(kind=SamplerKind.bucket, bucket_size=64), LENGTHS, 0,
                                         mixture=(source, [2.0, 0.5, 1.0])).global_batches(1))
    assert np.array_equal(e1, again)


def test_sampling_a_million_records_runs():
    # Correctness at scale (the timing is in scripts/bench_data.py, not here).
    lengths = np.random.default_rng(0).integers(10, 4096, size=1_000_000)
    batches = BucketSampler(lengths, 8, 0, bucket_size=512).global_batches(0)
    assert sum(len(b) for b in batches) == 1_000_000
    assert BudgetSampler(lengths[:50_000], 0, 512, 16384).global_batches(0)


@pytest.mark.parametrize("overrides,key", [([], "sampler.max_tokens"),
                                           (["sampler=shuffle"], "sampler.micro_batch_size"),
                                           (["objective=grpo"], "objective.prompts_per_rollout")])
def test_too_few_micro_batches_for_the_ranks_names_the_key_of_the_composed_sampler(compose, overrides, key):
    """A small file on 2 ranks: the refusal names the key that sets how many rows a micro-batch takes
    under the composed sampler (sampler.micro_batch_size is refused under budget and grpo), and the
    composition accepts that key on the command line."""
    from align.config import to_typed
    from align.data.prompts import WholeBatchSampler

    cfg = to_typed(compose(["logger=none", *overrides]))
    lengths = np.array([5, 7, 6])
    if cfg.objective.kind == "grpo":  # the rollout's prompt batches: prompts_per_rollout prompts each
        sampler = WholeBatchSampler(lengths, 2, seed=0, rank=0, world=2)
    else:
        sampler = build_sampler(dataclasses.replace(cfg.sampler, max_tokens=4096), lengths, seed=0, rank=0, world=2)
    with pytest.raises(ConfigError) as e:
        sampler.rank_batches(0)
    assert str(e.value).startswith(f"{key}: 1 micro-batches per epoch cannot be split over 2 ranks: a smaller {key}")
    to_typed(compose(["logger=none", *overrides, f"{key}=1"]))  # read by the composition: not refused as ignored
