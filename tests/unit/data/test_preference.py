"""Preference records -> encoded pairs (align/data/preference.py): both record forms parse, every kind of
bad record is refused with file:line (or counted and dropped under on_bad_record=skip), only completion
tokens carry loss, truncation applies per pair, and the encode cache key covers the pairing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from align.config import ModelConfig, TrainConfig
from align.data import encode_cache as cache_mod
from align.data.encode_cache import cache_key_parts, load_dataset
from align.data.preference import EncodedPairs, load_pairs
from align.errors import ConfigError
from tests.unit.data.conftest import write_jsonl

U = lambda text: {"role": "user", "content": text}  # noqa: E731
A = lambda text: {"role": "assistant", "content": text}  # noqa: E731


def train_cfg(tmp_path, path=None, objective="dpo", **data) -> TrainConfig:
    """A TrainConfig typed as Hydra types it, on a local preference file (or the bundled pairs)."""
    from omegaconf import OmegaConf

    d = dict(source="preference" if path else "gsm8k_pairs", path=str(path) if path else None,
             cache_dir=str(tmp_path / "cache"), encode_workers=0, max_seq_len=256)
    d.update(data)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig),
                                               {"data": d, "objective": {"kind": objective}}))


def pairs_of(tmp_path, tokenizer, rows, **data) -> EncodedPairs:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return load_pairs(train_cfg(tmp_path, write_jsonl(tmp_path / "p.jsonl", rows), **data), tokenizer)


def side_texts(tokenizer, pairs: EncodedPairs, p: int) -> list[tuple[str, str]]:
    """(context, trained) text of pair p's two sides: the tokens without and with loss, decoded."""
    out = []
    for row in (2 * p, 2 * p + 1):
        t, m = pairs.row(row)
        first = int(np.flatnonzero(m)[0])
        assert m[first:].all(), "the loss tokens must be one contiguous tail"
        out.append((tokenizer.decode(t[:first].tolist()), tokenizer.decode(t[first:].tolist())))
    return out


def render_prompt(tokenizer, chat) -> str:
    return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


# ------------------------------------------------------------------------------------ both forms


def test_explicit_prompt_as_string_and_as_chat(tmp_path, tokenizer):
    rows = [
        {"prompt": "what is 2+2?", "chosen": "4", "rejected": "5"},
        {"prompt": [{"role": "system", "content": "be brief"}, U("first"), A("one"), U("what is 3+3?")],
         "chosen": [A("6")], "rejected": [A("seven")]},
    ]
    pairs = pairs_of(tmp_path, tokenizer, rows)
    assert pairs.pairs == 2 and len(pairs) == 4
    assert pairs.pair_ids == ["p:1", "p:2"]
    assert pairs.ids == ["p:1/chosen", "p:1/rejected", "p:2/chosen", "p:2/rejected"]
    (c_ctx, c), (r_ctx, r) = side_texts(tokenizer, pairs, 0)
    assert c_ctx == r_ctx == render_prompt(tokenizer, [U("what is 2+2?")])
    assert (c, r) == ("4" + tokenizer.eos_token, "5" + tokenizer.eos_token)
    (c_ctx, c), (r_ctx, r) = side_texts(tokenizer, pairs, 1)
    # The prompt's own assistant turn ("one") is context: no loss on it.
    assert c_ctx == r_ctx == render_prompt(tokenizer, rows[1]["prompt"])
    assert (c, r) == ("6" + tokenizer.eos_token, "seven" + tokenizer.eos_token)


def test_implicit_prompt_is_the_shared_prefix(tmp_path, tokenizer):
    shared = [U("hi"), A("hello"), U("the capital of France?")]
    rows = [{"chosen": [*shared, A("Paris")], "rejected": [*shared, A("Lyon")]}]
    pairs = pairs_of(tmp_path, tokenizer, rows)
    (c_ctx, c), (r_ctx, r) = side_texts(tokenizer, pairs, 0)
    assert c_ctx == r_ctx == render_prompt(tokenizer, shared)
    assert (c, r) == ("Paris" + tokenizer.eos_token, "Lyon" + tokenizer.eos_token)
    # The same pair written with an explicit prompt encodes to the same tokens and masks.
    explicit = pairs_of(tmp_path / "x", tokenizer, [{"prompt": shared, "chosen": "Paris", "rejected": "Lyon"}])
    assert np.array_equal(explicit.tokens, pairs.tokens) and np.array_equal(explicit.loss_mask, pairs.loss_mask)


def test_bundled_pairs_train_only_on_the_solutions(tmp_path, tokenizer):
    from align.data.sources import bundled_gsm8k_pairs

    rows = [json.loads(line) for line in bundled_gsm8k_pairs().read_text().splitlines()[:16]]
    pairs = load_pairs(train_cfg(tmp_path, max_records=16, root_field="steps"), tokenizer)
    assert pairs.pairs == 16 and pairs.roots[0] == f"gsm8k_pairs/steps={rows[0]['steps']}"
    for p, row in enumerate(rows):
        (c_ctx, c), (r_ctx, r) = side_texts(tokenizer, pairs, p)
        assert c_ctx == r_ctx == render_prompt(tokenizer, [U(row["prompt"])])
        assert (c, r) == (row["chosen"] + tokenizer.eos_token, row["rejected"] + tokenizer.eos_token)
    # The stream's loss tokens are exactly the completions' tokens (each one a target of its left neighbour).
    assert pairs.stats["loss_tokens"] == int(pairs.loss_mask.sum())


# ----------------------------------------------------------------------------------- bad records

GOOD = {"prompt": "q", "chosen": "yes", "rejected": "no"}
BAD = [
    ({"prompt": "q", "chosen": "yes"}, "missing_side", "record has no 'rejected'"),
    ({"prompt": "q", "chosen": None, "rejected": "no"}, "missing_side", "record has no 'chosen'"),
    ({"prompt": "q", "chosen": "same", "rejected": "same"}, "identical", "'chosen' and 'rejected' are identical"),
    ({"chosen": [U("q"), A("a")], "rejected": [U("q"), A("a")]}, "identical", "the same conversation"),
    ({"prompt": "q", "chosen": "yes", "rejected": "  "}, "empty_completion", "the 'rejected' completion is empty"),
    ({"prompt": "q", "chosen": [A("")], "rejected": "no"}, "empty_completion", "the 'chosen' completion is empty"),
    ({"prompt": "long " * 300, "chosen": "yes", "rejected": "no"}, "prompt_too_long", "leaves no room for a"),
    ({"chosen": [U("q"), A("a")], "rejected": [U("other"), A("b")]}, "no_shared_prompt", "must share every turn"),
    ({"chosen": [U("q"), A("a"), U("more"), A("c")], "rejected": [U("q"), A("b")]}, "no_shared_prompt",
     "share 1 of 4 and 2 turns"),
    ({"chosen": "a", "rejected": "b"}, "malformed", "a record without 'prompt' needs 'chosen' and 'rejected' as chats"),
    ({"prompt": "q", "chosen": [A("a"), A("b")], "rejected": "no"}, "malformed", "a list holding one assistant"),
    ({"prompt": [U("q"), A("a")], "chosen": "yes", "rejected": "no"}, "malformed", "not end with an assistant turn"),
    ({"prompt": "q", "chosen": [{"role": "robot", "content": "x"}], "rejected": "no"}, "malformed", "role is 'robot'"),
    ({"prompt": "q", "chosen": [{"role": "assistant", "content": 3}], "rejected": "no"}, "malformed",
     "content is of type int"),
    ({"prompt": 7, "chosen": "yes", "rejected": "no"}, "malformed", "'prompt' must be a string or a list"),
    ("{not json", "malformed", "malformed JSON"),
    ("[1, 2]", "malformed", "a record must be a JSON object"),
]


@pytest.mark.parametrize("row,reason,match", BAD, ids=[f"{r}-{i}" for i, (_, r, _) in enumerate(BAD)])
def test_a_bad_record_is_one_line_naming_file_and_line(tmp_path, tokenizer, row, reason, match):
    f = write_jsonl(tmp_path / "p.jsonl", [GOOD, row, GOOD | {"chosen": "sure"}])
    with pytest.raises(ConfigError, match=match) as e:
        load_pairs(train_cfg(tmp_path, f), tokenizer)
    assert e.value.key == f"{f}:2" and "\n" not in str(e.value)
    assert "data.on_bad_record=skip" in str(e.value)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir()), "nothing half-written"


def test_bad_records_are_counted_per_reason_and_dropped_under_skip(tmp_path, tokenizer):
    rows = [GOOD, *[row for row, _, _ in BAD], GOOD | {"chosen": "sure"}]
    pairs = pairs_of(tmp_path, tokenizer, rows, on_bad_record="skip")
    assert pairs.pair_ids == ["p:1", f"p:{len(rows)}"]
    expected: dict[str, int] = {}
    for _, reason, _ in BAD:
        expected[reason] = expected.get(reason, 0) + 1
    assert pairs.stats["skipped_by_reason"] == dict(sorted(expected.items()))
    assert pairs.stats["skipped_bad"] == len(BAD) == pairs.meta["skipped_bad"]
    assert pairs.stats["records_kept"] == 2
    assert pairs.stats["skipped_where"][0].startswith(f"{tmp_path / 'p.jsonl'}:2: ")


def test_duplicate_ids_are_bad_records(tmp_path, tokenizer):
    rows = [GOOD | {"uid": "a"}, GOOD | {"uid": "a", "chosen": "sure"}]
    with pytest.raises(ConfigError, match="duplicate record id 'p:a'") as e:
        pairs_of(tmp_path, tokenizer, rows, id_field="uid")
    assert e.value.key.endswith("p.jsonl:2")


def test_a_file_with_no_usable_pair_is_refused(tmp_path, tokenizer):
    with pytest.raises(ConfigError, match=r"no usable preference records in .* \(1 skipped as bad\)") as e:
        pairs_of(tmp_path, tokenizer, [{"prompt": "q", "chosen": "x"}], on_bad_record="skip")
    assert e.value.key == "data"


def test_chat_sources_and_mask_files_are_refused_for_pairs_and_pairs_for_sft(tmp_path, tokenizer):
    with pytest.raises(ConfigError, match="objective=dpo trains on preference pairs") as e:
        train_cfg(tmp_path, source="gsm8k")  # refused when the config is typed, before any load
    assert e.value.key == "data"
    mask = write_jsonl(tmp_path / "m.jsonl", [{"id": "x", "turns": [1]}])
    with pytest.raises(ConfigError) as e:
        load_pairs(train_cfg(tmp_path, mask_files=[str(mask)]), tokenizer)
    assert e.value.key == "data.mask_files"
    cfg = train_cfg(tmp_path)
    with pytest.raises(ConfigError, match="holds preference pairs") as e:
        load_dataset(cfg.data, cfg.model, tokenizer)
    assert e.value.key == "data.source"


def test_a_mixture_of_pairs_and_chat_records_is_refused_at_compose_time(tmp_path):
    with pytest.raises(ConfigError, match="mixes preference pairs with chat records") as e:
        train_cfg(tmp_path, mixture={"a": {"kind": "gsm8k"}, "b": {"kind": "gsm8k_pairs"}})
    assert e.value.key == "data.mixture"


# ------------------------------------------------------------------------------------ truncation


def test_truncation_applies_per_pair(tmp_path, tokenizer):
    rows = [GOOD, {"prompt": "q", "chosen": "long answer " * 40, "rejected": "no"}, GOOD | {"chosen": "sure"}]
    whole = pairs_of(tmp_path / "w", tokenizer, rows, max_seq_len=4096)
    n_long = int(whole.lengths[2])
    assert n_long > 40

    dropped = pairs_of(tmp_path / "d", tokenizer, rows, max_seq_len=40, truncation="drop")
    assert dropped.pair_ids == ["p:1", "p:3"] and dropped.stats["dropped_too_long"] == 1
    assert dropped.stats["dropped_ids"] == ["p:2"] and not dropped.truncated.any()

    cut = pairs_of(tmp_path / "t", tokenizer, rows, max_seq_len=40, truncation="truncate")
    assert cut.pair_ids == ["p:1", "p:2", "p:3"] and cut.truncated.tolist() == [False, True, False]
    assert cut.lengths[2] == 40 and cut.lengths[3] == whole.lengths[3] and cut.stats["truncated_ids"] == ["p:2"]
    assert np.array_equal(cut.row(2)[0], whole.row(2)[0][:40]) and cut.row(2)[1].any()

    with pytest.raises(ConfigError) as e:
        pairs_of(tmp_path / "f", tokenizer, rows, max_seq_len=40, truncation="fail")
    assert e.value.key.endswith("p.jsonl:2")
    assert f"a side of pair p:2 has {n_long} tokens, more than data.max_seq_len=40" in e.value.message


SHARED = "the same long reasoning " * 12
COLLAPSING = {"prompt": "q", "chosen": SHARED + "so yes", "rejected": SHARED + "so no"}  # differ past 40 tokens


def test_a_pair_that_truncation_makes_identical_is_refused_with_file_and_line(tmp_path, tokenizer):
    """The text check passes (the sides differ), but cut at max_seq_len both are the same sequence:
    loss log 2 and no gradient, a pair that trains nothing while it counts as one."""
    rows = [GOOD, COLLAPSING, GOOD | {"chosen": "sure"}]
    with pytest.raises(ConfigError) as e:
        pairs_of(tmp_path / "f", tokenizer, rows, max_seq_len=40, truncation="truncate")
    assert e.value.key.endswith("p.jsonl:2") and "\n" not in str(e.value)
    assert "differ only past data.max_seq_len=40" in e.value.message and "accepted: a larger" in e.value.message
    skipped = pairs_of(tmp_path / "s", tokenizer, rows, max_seq_len=40, truncation="truncate", on_bad_record="skip")
    assert skipped.pair_ids == ["p:1", "p:3"]
    assert skipped.stats["skipped_by_reason"] == {"identical_after_truncation": 1}
    assert skipped.stats["skipped_where"][0].startswith(f"{tmp_path / 's' / 'p.jsonl'}:2: ")
    whole = pairs_of(tmp_path / "w", tokenizer, rows, max_seq_len=256, truncation="truncate")  # within the length: kept
    assert whole.pair_ids == ["p:1", "p:2", "p:3"] and not np.array_equal(whole.row(2)[0], whole.row(3)[0])


def test_a_file_where_every_pair_collapses_cannot_start(tmp_path, tokenizer):
    rows = [COLLAPSING, COLLAPSING | {"rejected": SHARED + "maybe"}]
    with pytest.raises(ConfigError, match=r"no pair is left to train on: .* 2 skipped as bad \(2 of them identical "
                                          r"once encoded\)") as e:
        pairs_of(tmp_path, tokenizer, rows, max_seq_len=40, truncation="truncate", on_bad_record="skip")
    assert e.value.key == "data.max_seq_len"


def test_sides_the_template_renders_alike_are_a_bad_pair(tmp_path, tokenizer):
    """A template that trims the content makes "yes" and "yes " one sequence: compared as tokens."""
    import copy

    from align.data.preference import BadRecords, encode_pairs, load_preference_records

    trimming = copy.deepcopy(tokenizer)
    trimming.chat_template = tokenizer.chat_template.replace("{{ m['content'] }}", "{{ m['content'] | trim }}")
    cfg = train_cfg(tmp_path, write_jsonl(tmp_path / "p.jsonl", [GOOD, GOOD | {"rejected": "yes "}]))
    bad = BadRecords(cfg.data.on_bad_record)
    records = load_preference_records(cfg.data, bad)
    assert len(records) == 2  # as text the sides differ
    assert encode_pairs(records, tokenizer, cfg.data, bad).pairs == 2
    with pytest.raises(ConfigError, match="render to the same .* tokens through the chat template") as e:
        encode_pairs(records, trimming, cfg.data, bad)
    assert e.value.key.endswith("p.jsonl:2")


def test_workers_encode_exactly_as_in_process(tmp_path, tokenizer):
    cfg0 = train_cfg(tmp_path / "a", max_records=48, encode_workers=0, on_bad_record="skip")
    cfg2 = train_cfg(tmp_path / "b", max_records=48, encode_workers=2, on_bad_record="skip")
    a, b = load_pairs(cfg0, tokenizer), load_pairs(cfg2, tokenizer)
    for name in ("tokens", "loss_mask", "offsets", "source_index", "truncated"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.ids == b.ids and a.meta["fingerprint"] == b.meta["fingerprint"]


# ----------------------------------------------------------------------------------------- cache


def test_cache_hit_returns_the_same_pairs(tmp_path, tokenizer):
    cfg = train_cfg(tmp_path, max_records=32)
    miss = load_pairs(cfg, tokenizer)
    hit = load_pairs(cfg, tokenizer)
    assert (miss.meta["cache_hit"], hit.meta["cache_hit"]) == (False, True)
    for name in ("tokens", "loss_mask", "offsets", "source_index", "truncated"):
        assert np.array_equal(getattr(miss, name), getattr(hit, name)), name
    assert (hit.ids, hit.roots, hit.pair_ids) == (miss.ids, miss.roots, miss.pair_ids)
    assert hit.meta["fingerprint"] == miss.meta["fingerprint"]
    assert hit.meta["pairing_version"] == cache_mod.PAIRING_VERSION
    assert hit.stats == miss.stats


def test_the_key_covers_the_pairing_version(tmp_path, monkeypatch):
    cfg = train_cfg(tmp_path)
    before = cache_key_parts(cfg.data, cfg.model)
    assert before["pairing"] == {"version": cache_mod.PAIRING_VERSION}
    monkeypatch.setattr(cache_mod, "PAIRING_VERSION", cache_mod.PAIRING_VERSION + 1)
    assert cache_key_parts(cfg.data, cfg.model)["key"] != before["key"]


def test_the_key_covers_the_chat_template(tmp_path):
    import shutil

    from align.data.tokenizer import bundled_tokenizer_dir

    tdir = tmp_path / "tok"
    shutil.copytree(bundled_tokenizer_dir(), tdir)
    cfg = train_cfg(tmp_path)
    base = cache_key_parts(cfg.data, ModelConfig(pretrained=str(tdir)))["key"]
    (tdir / "chat_template.jinja").write_text((tdir / "chat_template.jinja").read_text().replace("<|end|>", "<|stop|>"))
    assert cache_key_parts(cfg.data, ModelConfig(pretrained=str(tdir)))["key"] != base


def test_chat_record_keys_carry_no_pairing(tmp_path):
    cfg = train_cfg(tmp_path, source="gsm8k", objective="sft")
    parts = cache_key_parts(cfg.data, cfg.model)
    assert parts["pairing"] is None
    keyed = {k: v for k, v in parts.items() if k not in ("key", "aux_files", "source_specs", "pairing")}
    assert cache_mod.encode_cache_key(**keyed) == parts["key"], "a chat key is what it was before pairs existed"
