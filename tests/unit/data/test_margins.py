"""A pair's `margin` (TRL's RewardTrainer margin column, align/data/margins.py): read from each record into the
encoded pairs and their cache, carried by every micro-batch (padded or packed) to its pairs, held out with them,
recorded in the stats, and refused with the record's file:line where it is not a finite number, on some pairs and
not others, or under an objective that reads none (objective=dpo, objective=kto), in preflight and at load."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from align.data.pairs import collate_pairs, hold_out, sequence_rows
from align.data.preference import load_pairs
from align.errors import ConfigError
from tests.unit.data.conftest import write_jsonl
from tests.unit.data.test_preference import train_cfg

MARGINS = [0.5, 2, -1.25, 0.0, 3.75, 1]


def rows(margins=MARGINS):
    return [{"prompt": f"what is {i} + {i}?", "chosen": f"it is {2 * i}", "rejected": f"it is {2 * i + 1}",
             **({} if m is None else {"margin": m})} for i, m in enumerate(margins)]


def cfg_for(tmp_path, records, objective="reward_model", name="p.jsonl", **data):
    tmp_path.mkdir(parents=True, exist_ok=True)
    return train_cfg(tmp_path, write_jsonl(tmp_path / name, records), objective=objective, **data)


def test_margins_reach_the_encoded_pairs_their_cache_and_the_stats(tmp_path, tokenizer):
    cfg = cfg_for(tmp_path, rows())
    first = load_pairs(cfg, tokenizer)
    again = load_pairs(cfg, tokenizer)
    assert (first.meta["cache_hit"], again.meta["cache_hit"]) == (False, True)
    for pairs in (first, again):
        assert pairs.margin.dtype == np.float64 and pairs.margin.tolist() == [float(m) for m in MARGINS]
        assert pairs.stats["margin"] == {"column": "margin", "pairs": 6, "min": -1.25, "max": 3.75,
                                         "mean": pytest.approx(np.mean(MARGINS)), "first": f"{tmp_path / 'p.jsonl'}:1"}
    plain = load_pairs(cfg_for(tmp_path / "plain", rows([None] * 6)), tokenizer)
    cached = load_pairs(cfg_for(tmp_path / "plain", rows([None] * 6)), tokenizer)
    assert plain.margin is None and cached.margin is None and plain.stats["margin"] is None
    other = load_pairs(cfg_for(tmp_path / "other", rows([*MARGINS[:-1], 9])), tokenizer)
    assert other.pair_ids == first.pair_ids and other.tokens.tolist() == first.tokens.tolist()
    assert other.meta["fingerprint"] != first.meta["fingerprint"]  # a resume on other margins is other data


@pytest.mark.parametrize("packed", [False, True])
def test_every_micro_batch_carries_its_pairs_margins_and_held_out_pairs_keep_theirs(tmp_path, tokenizer, packed):
    pairs = load_pairs(cfg_for(tmp_path, rows()), tokenizer)
    picked = np.array([4, 1, 3])
    b = collate_pairs(pairs, sequence_rows(picked), tokenizer.pad_token_id, packed=packed)
    assert b.packed == packed and b.margin.dtype == torch.float32
    assert b.margin.tolist() == [float(MARGINS[p]) for p in picked]
    held, rest = hold_out(pairs, 2)
    assert held.margin.tolist() == [0.5, 2.0] and rest.margin.tolist() == [float(m) for m in MARGINS[2:]]
    assert collate_pairs(rest, sequence_rows([0]), tokenizer.pad_token_id).margin.tolist() == [-1.25]
    plain = load_pairs(cfg_for(tmp_path / "plain", rows([None] * 6)), tokenizer)
    assert collate_pairs(plain, sequence_rows(picked), tokenizer.pad_token_id, packed=packed).margin is None


@pytest.mark.parametrize("bad", ["1.5", True, float("nan"), float("inf"), [1]])
def test_a_margin_that_is_not_a_finite_number_is_refused_naming_its_line(tmp_path, tokenizer, bad):
    records = rows()
    records[3]["margin"] = bad
    cfg = cfg_for(tmp_path, records)
    with pytest.raises(ConfigError) as e:
        load_pairs(cfg, tokenizer)
    assert e.value.key == f"{tmp_path / 'p.jsonl'}:4" and "accepted: a finite number" in str(e.value)
    skipped = load_pairs(cfg_for(tmp_path / "skip", records, on_bad_record="skip"), tokenizer)
    assert skipped.pairs == 5 and skipped.stats["skipped_by_reason"] == {"margin": 1}


def test_margins_on_some_pairs_and_not_others_are_refused_naming_a_pair_without_one(tmp_path, tokenizer):
    with pytest.raises(ConfigError) as e:
        load_pairs(cfg_for(tmp_path, rows([0.5, 1, None, 2, None, 1])), tokenizer)
    assert e.value.key == f"{tmp_path / 'p.jsonl'}:3" and "has no 'margin' while" in str(e.value)
    assert "on every pair or on none" in str(e.value)


def test_margins_under_an_objective_that_reads_none_are_refused_not_dropped(tmp_path, tokenizer):
    """objective=dpo is refused on its own encoding and on the cache entry a reward model run left (the key does
    not name the objective); objective=kto, which unpairs the pairs, too."""
    from align.data.unpaired import load_examples_encoded

    where = f"{tmp_path / 'p.jsonl'}:1"
    for _ in range(2):  # encoded, then from the cache
        with pytest.raises(ConfigError) as e:
            load_pairs(cfg_for(tmp_path, rows(), objective="dpo"), tokenizer)
        assert e.value.key == where and "objective=dpo does not read" in str(e.value), str(e.value)
        assert "objective=reward_model" in str(e.value)
    load_pairs(cfg_for(tmp_path, rows()), tokenizer)  # reward_model reads it: accepted, cached
    with pytest.raises(ConfigError, match="objective=dpo does not read") as e:
        load_pairs(cfg_for(tmp_path, rows(), objective="dpo"), tokenizer)
    assert e.value.key == where
    with pytest.raises(ConfigError, match="unpaired into a desirable and an undesirable example") as e:
        load_examples_encoded(cfg_for(tmp_path, rows(), objective="kto"), tokenizer)
    assert e.value.key == where


def test_preflight_parses_the_pairs_and_refuses_a_margin_before_the_run_dir(tmp_path):
    from align.core.provenance import code_root
    from align.run.checklist import Context
    from align.run.preflight_checks import check_files

    def check(records, objective):
        cfg = cfg_for(tmp_path, records, objective=objective, name=f"{objective}-{len(json.dumps(records))}.jsonl")
        [c] = [c for c in check_files(cfg, Context(root=code_root(), stop_on_fail=False)) if c.name == "pair records"]
        return c, cfg.data.path

    c, path = check(rows(), "reward_model")
    assert c.ok and c.detail == "6 pairs, 'margin' on every pair (from -1.25 to 3.75), read by objective=reward_model"
    c, path = check(rows([None] * 6), "dpo")
    assert c.ok and c.detail == "6 pairs, no 'margin' field"
    c, path = check(rows(), "dpo")
    assert not c.ok and c.key == f"{path}:1" and "objective=dpo does not read" in c.detail
    bad = rows()
    bad[1]["margin"] = "wide"
    c, path = check(bad, "reward_model")
    assert not c.ok and c.key == f"{path}:2" and "'margin' is 'wide'; accepted: a finite number" in c.detail
