"""Pair micro-batches (align/data/pairs.py): both sides of every pair land in the same micro-batch under
every sampler, padded or packed, on every rank and across a resume; the budget holds; the pair fields
of Batch say which sequence every label belongs to; the statistics describe what collate builds."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch

from align.config import TrainConfig
from align.data.collate import IGNORE, collate
from align.data.pairs import PairSampler, build_pair_stream, collate_pairs
from align.data.preference import EncodedPairs, load_pairs

SAMPLERS = [
    ("shuffle", False, {}), ("bucket", False, {}), ("budget", False, {}),
    ("shuffle", True, {}), ("bucket", True, {}), ("budget", True, {}),
    ("budget", False, {"pad_to_multiple_of": 8}), ("bucket", True, {"pad_to_multiple_of": 8}),
]
IDS = [f"{k}-{'packed' if p else 'padded'}{'-x8' if kw else ''}" for k, p, kw in SAMPLERS]


def cfg_for(tmp_path, kind="bucket", packed=False, grad_accum=1, **sampler) -> TrainConfig:
    from omegaconf import OmegaConf

    s = dict(kind=kind, packed=packed, micro_batch_size=3, bucket_size=12, **sampler)
    if kind == "budget":
        s.setdefault("max_tokens", 1600)
    d = dict(source="gsm8k_pairs", root_field="steps", max_records=61, cache_dir=str(tmp_path / "cache"),
             encode_workers=0, max_seq_len=256)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig),
                                               {"data": d, "sampler": s, "trainer": {"grad_accum": grad_accum},
                                                "objective": {"kind": "dpo"}}))


@pytest.fixture(scope="module")
def pairs(tokenizer, tmp_path_factory) -> EncodedPairs:
    return load_pairs(cfg_for(tmp_path_factory.mktemp("pairs")), tokenizer)


def stream_of(tmp_path, pairs, tokenizer, rank=0, world=1, **kw):
    return build_pair_stream(cfg_for(tmp_path, **kw), pairs, tokenizer.pad_token_id, rank, world)


def assert_whole_pairs(b, pairs: EncodedPairs) -> None:
    """Every pair of `b` has both sides in `b`, chosen_seq/rejected_seq point at them, seq_ids name them."""
    rows = b.rows
    assert b.pairs == len(rows) // 2 == len(b.chosen_seq) == len(b.rejected_seq)
    chosen, rejected = rows[b.chosen_seq.numpy()], rows[b.rejected_seq.numpy()]
    assert np.array_equal(chosen // 2, rejected // 2) and np.array_equal(chosen // 2, b.pair_rows)
    for c, r in zip(chosen, rejected):
        assert pairs.ids[c].endswith("/chosen") and pairs.ids[r].endswith("/rejected")
        assert pairs.ids[c].removesuffix("/chosen") == pairs.ids[r].removesuffix("/rejected")
    # The sequence of every label position, counted: exactly each sequence's loss tokens.
    counts = Counter(b.seq_ids[b.seq_ids >= 0].tolist())
    for s, row in enumerate(rows):
        assert counts.get(s, 0) == int(pairs.row(int(row))[1][1:].sum()) > 0
    assert torch.equal(b.seq_ids < 0, b.labels == IGNORE)
    assert b.truncated_pairs == int(pairs.truncated[b.pair_rows].sum())


@pytest.mark.parametrize("kind,packed,kw", SAMPLERS, ids=IDS)
def test_both_sides_of_every_pair_share_a_micro_batch_across_epochs(tmp_path, tokenizer, pairs, kind, packed, kw):
    s = stream_of(tmp_path, pairs, tokenizer, kind=kind, packed=packed, **kw)
    per_epoch = len(s.sampler.rank_batches(0))
    seen = []
    for b in itertools.islice(iter(s), per_epoch + 3):  # into the second epoch
        assert_whole_pairs(b, pairs)
        assert b.packed == packed and (b.attention_mask is None if packed else True)
        seen.append(b)
    first = np.concatenate([b.pair_rows for b in seen[:per_epoch]])
    assert sorted(first.tolist()) == list(range(pairs.pairs)), "an epoch serves every pair once"
    if kind == "budget":
        assert all(b.tokens <= s.sampler.inner.max_tokens for b in seen)


@pytest.mark.parametrize("kind,packed,kw", SAMPLERS, ids=IDS)
@pytest.mark.parametrize("k", [0, 5, 19])
def test_a_resume_lands_on_the_next_micro_batch_with_whole_pairs(tmp_path, tokenizer, pairs, kind, packed, kw, k):
    ref = stream_of(tmp_path, pairs, tokenizer, kind=kind, packed=packed, **kw)
    it = iter(ref)
    for _ in range(k):
        next(it)
    state = ref.state_dict()
    expected = list(itertools.islice(it, 6))
    resumed = stream_of(tmp_path, pairs, tokenizer, kind=kind, packed=packed, **kw)
    resumed.load_state_dict(state)
    got = list(itertools.islice(iter(resumed), 6))
    for a, b in zip(expected, got, strict=True):
        assert_whole_pairs(b, pairs)
        assert np.array_equal(a.rows, b.rows) and torch.equal(a.input_ids, b.input_ids)
        assert torch.equal(a.seq_ids, b.seq_ids) and torch.equal(a.labels, b.labels)


def test_ranks_draw_disjoint_whole_pairs(tmp_path, tokenizer, pairs):
    mine = [np.concatenate([b for b in stream_of(tmp_path, pairs, tokenizer, rank=r, world=2).sampler.rank_batches(0)])
            for r in range(2)]
    for rows in mine:
        assert np.array_equal(rows[0::2] + 1, rows[1::2])
    assert not set(mine[0].tolist()) & set(mine[1].tolist())


def test_the_pair_fingerprint_refuses_a_resume_of_chat_order(tmp_path, tokenizer, pairs):
    from align.data.loader import build_stream
    from align.errors import ConfigError

    cfg = cfg_for(tmp_path)
    chat = build_stream(cfg, pairs, tokenizer.pad_token_id)  # the same rows drawn one sequence at a time
    with pytest.raises(ConfigError, match="sampler settings"):
        stream_of(tmp_path, pairs, tokenizer).load_state_dict(chat.state_dict())


def test_padded_and_packed_pair_fields(tmp_path, tokenizer, pairs):
    rows = np.array([4, 5, 0, 1, 10, 11])
    padded = collate_pairs(pairs, rows, tokenizer.pad_token_id, 8)
    packed = collate_pairs(pairs, rows, tokenizer.pad_token_id, 8, packed=True)
    assert padded.chosen_seq.tolist() == [0, 2, 4] and padded.rejected_seq.tolist() == [1, 3, 5]
    assert padded.pair_rows.tolist() == [2, 0, 5] and padded.pairs == 3
    lens = pairs.lengths[rows]
    for s in range(6):  # padded: row s; its labels' sequence is s
        assert set(padded.seq_ids[s][padded.seq_ids[s] >= 0].tolist()) == {s}
    starts = np.concatenate([[0], np.cumsum(lens)])
    for s in range(6):  # packed: document s spans starts[s]:starts[s+1]
        span = packed.seq_ids[0, starts[s]:starts[s + 1]]
        assert set(span[span >= 0].tolist()) == {s} and span[-1] == -1  # a document's last token predicts nothing
    assert (packed.seq_ids[0, starts[-1]:] == -1).all()
    # The same tokens and targets as chat collate: the pair fields are additions, nothing else changes.
    plain = collate(pairs, rows, tokenizer.pad_token_id, 8, packed=True)
    assert torch.equal(plain.input_ids, packed.input_ids) and torch.equal(plain.labels, packed.labels)
    with pytest.raises(ValueError, match="whole pairs"):
        collate_pairs(pairs, np.array([1, 0]), tokenizer.pad_token_id)
    with pytest.raises(ValueError, match="whole pairs"):
        collate_pairs(pairs, np.array([0, 1, 2]), tokenizer.pad_token_id)


def test_batch_to_moves_the_pair_tensors(tokenizer, pairs):
    b = collate_pairs(pairs, np.array([0, 1, 2, 3]), tokenizer.pad_token_id).to(torch.device("meta"))
    assert all(t.device.type == "meta" for t in (b.input_ids, b.seq_ids, b.chosen_seq, b.rejected_seq))


def test_sft_batches_carry_no_pair_fields(tokenizer, pairs):
    b = collate(pairs, np.array([0, 1]), tokenizer.pad_token_id)
    assert (b.seq_ids, b.chosen_seq, b.rejected_seq, b.pairs, b.truncated_pairs, b.pair_rows) == (None,) * 6


@pytest.mark.parametrize("kind,packed,kw", SAMPLERS, ids=IDS)
def test_padding_waste_and_roots_describe_the_collated_micro_batches(tmp_path, tokenizer, pairs, kind, packed, kw):
    s = stream_of(tmp_path, pairs, tokenizer, kind=kind, packed=packed, grad_accum=2, **kw)
    batches = [s.collate_fn(pairs, rows, s.pad_id, s.mult, s.packed) for rows in s.sampler.rank_batches(0)]
    tokens, real = sum(b.tokens for b in batches), sum(b.real_tokens for b in batches)
    st = s.sampler.stats()
    assert st["unit"] == "pair" and st["micro_batches_per_epoch"] == len(batches)
    assert st["padding_waste_epoch0"] == pytest.approx(1 - real / tokens, abs=1e-12)
    assert st["global"]["max_batch_tokens"] == max(b.tokens for b in batches)
    # The shuffle baseline draws whole pairs too: its batches hold both sides of each pair.
    base = s.sampler.shuffle_baseline(6)
    assert isinstance(base, PairSampler) and all(np.array_equal(r[0::2] + 1, r[1::2]) for r in base.global_batches(0))
    assert 1 <= st["global"]["roots_per_window"] <= len(set(pairs.roots))
    window = s.stats.step(batches[:2])
    assert window["roots_in_window"] == len({pairs.roots[int(r)] for b in batches[:2] for r in b.rows})


@pytest.mark.parametrize("mult", [1, 8])
def test_the_budget_sampler_sees_what_a_padded_pair_costs(tmp_path, tokenizer, pairs, mult):
    """A pair's unit is two rows of its longer side's padded width, so the budget sampler's rows x width
    is exactly the tokens of the padded micro-batch (the pair's total length would undercount a pair
    with one long side by up to half)."""
    s = stream_of(tmp_path, pairs, tokenizer, kind="budget", max_tokens=1600, pad_to_multiple_of=mult)
    inner = s.sampler.inner
    for unit_batch, rows in zip(inner.global_batches(0), s.sampler.global_batches(0), strict=True):
        b = collate_pairs(pairs, rows, tokenizer.pad_token_id, mult)
        assert len(unit_batch) * int(inner.lengths[unit_batch].max()) == b.tokens <= 1600
    chosen, rejected = pairs.side_lengths
    assert (np.abs(chosen - rejected) > 0).any(), "the data must hold pairs of unequal sides for this to show anything"


def test_a_mixture_of_pair_sources_weighs_pairs_per_source(tmp_path, tokenizer):
    from omegaconf import OmegaConf

    from tests.unit.data.conftest import write_jsonl

    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt": f"qa{i}", "chosen": "yes", "rejected": "no"} for i in range(6)])
    b = write_jsonl(tmp_path / "b.jsonl", [{"prompt": f"qb{i}", "chosen": "yes", "rejected": "no"} for i in range(6)])
    mix = {"a": {"kind": "preference", "path": str(a), "weight": 2.0}, "b": {"kind": "preference", "path": str(b)}}
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), {
        "data": {"mixture": mix, "cache_dir": str(tmp_path / "c"), "encode_workers": 0},
        "sampler": {"micro_batch_size": 2}, "objective": {"kind": "dpo"}}))
    pairs = load_pairs(cfg, tokenizer)
    assert pairs.pair_ids[:1] == ["a:1"] and pairs.meta["records_per_source"] == [6, 6]
    s = build_pair_stream(cfg, pairs, tokenizer.pad_token_id)
    served = np.concatenate(s.sampler.rank_batches(0))
    assert np.array_equal(served[0::2] + 1, served[1::2])
    by_source = Counter(pairs.pair_ids[int(r) // 2].split(":")[0] for r in served[0::2])
    assert by_source == {"a": 12, "b": 6}
