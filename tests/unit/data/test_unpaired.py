"""Unpaired examples (align/data/unpaired.py): both record forms, bad records refused with file:line (or
counted under skip), KL partners that never share the example's prompt, and an encode cache entry of
their own."""

from __future__ import annotations

import pytest

from align.data.encode_cache import cache_key_parts
from align.data.unpaired import cache_parts, kl_partners, load_examples_encoded
from align.errors import ConfigError
from tests.unit.data.conftest import write_jsonl
from tests.unit.data.test_preference import train_cfg

ROWS = [{"prompt": "what is 1 + 1?", "completion": "2", "label": True},
        {"prompt": [{"role": "user", "content": "what is 2 + 2?"}],
         "completion": [{"role": "assistant", "content": "5"}], "label": False},
        {"prompt": "what is 3 + 3?", "completion": "6", "label": True}]


def examples(tmp_path, tokenizer, rows, **data):
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = train_cfg(tmp_path, write_jsonl(tmp_path / "kto.jsonl", rows), objective="kto", **data)
    return load_examples_encoded(cfg, tokenizer)


def test_unpaired_records_as_strings_and_chats_keep_their_labels(tmp_path, tokenizer):
    data = examples(tmp_path, tokenizer, ROWS)
    assert data.labels.tolist() == [True, False, True] and data.kl_partner.tolist() == [2, 0, 1]
    trained = [tokenizer.decode(t[m].tolist()) for t, m in (data.row(r) for r in range(6))]
    assert trained == ["2<|eos|>", "6<|eos|>", "5<|eos|>", "2<|eos|>", "6<|eos|>", "5<|eos|>"]  # 2e + 1: e's KL


def test_pairs_are_unpaired_chosen_first_then_rejected(tmp_path, tokenizer):
    pairs = [{"prompt": f"q{i}", "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(3)]
    data = examples(tmp_path, tokenizer, pairs)
    assert data.pair_ids == [f"kto:{n}/{side}" for side in ("chosen", "rejected") for n in (1, 2, 3)]
    assert data.labels.tolist() == [True] * 3 + [False] * 3


@pytest.mark.parametrize("bad,reason,message", [
    ({"prompt": "q", "completion": "a"}, "missing_key", "record has no 'label'"),
    ({"prompt": "q", "completion": "a", "label": 1}, "label", "'label' must be a JSON boolean"),
    ({"prompt": "q", "label": True}, "missing_key", "record has no 'completion'"),
    ({"prompt": "q", "completion": " ", "label": True}, "empty_completion", "the completion is empty"),
])
def test_a_bad_record_is_refused_naming_its_line_or_counted_under_skip(tmp_path, tokenizer, bad, reason, message):
    rows = [*ROWS[:2], bad, ROWS[2]]
    with pytest.raises(ConfigError) as e:
        examples(tmp_path / "fail", tokenizer, rows)
    assert e.value.key == f"{tmp_path / 'fail' / 'kto.jsonl'}:3" and message in e.value.message
    data = examples(tmp_path / "skip", tokenizer, rows, on_bad_record="skip")
    assert data.pairs == 3 and data.stats["skipped_by_reason"] == {reason: 1}


def test_a_file_mixing_the_two_forms_is_refused(tmp_path, tokenizer):
    with pytest.raises(ConfigError, match="mix unpaired examples and preference pairs"):
        examples(tmp_path, tokenizer, [ROWS[0], {"prompt": "q", "chosen": "a", "rejected": "b"}])


def test_kl_partners_skip_examples_of_the_same_prompt_and_one_prompt_is_refused(tmp_path, tokenizer):
    assert kl_partners([(1,), (1,), (2,), (2,), (3,)]).tolist() == [4, 4, 1, 1, 3]
    same = [{**r, "prompt": "the one prompt"} for r in ROWS]
    with pytest.raises(ConfigError, match="needs another prompt's completion"):
        examples(tmp_path, tokenizer, same)


def test_the_encode_cache_key_differs_from_the_pairs_of_the_same_file(tmp_path):
    cfg = train_cfg(tmp_path, write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "b"}]),
                    objective="kto")
    assert cache_parts(cfg)["key"] != cache_key_parts(cfg.data, cfg.model)["key"]
