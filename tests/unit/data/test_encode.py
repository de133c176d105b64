"""Encoding: prompt masking + EOS, auxiliary mask files OR-merged, truncation policies and report,
parallel == in-process, and nothing written into the cache on bad input."""

from __future__ import annotations

import os

import numpy as np
import pytest

from align.config import ModelConfig
from align.data.encode import encode_records
from align.data.encode_cache import load_dataset
from align.data.masks import load_mask_files
from align.data.sources import load_records
from align.errors import ConfigError
from tests.unit.data.conftest import chat, data_cfg, write_jsonl


def _trained_text(tokenizer, data, i):
    t, m = data.row(i)
    return tokenizer.decode(t[m].tolist())


def test_only_assistant_answers_and_eos_carry_loss(tmp_path, tokenizer):
    f = write_jsonl(tmp_path / "c.jsonl", [chat("what is two plus two", "four", "and three", "five")])
    data = load_dataset(data_cfg(f, tmp_path), ModelConfig(), tokenizer)
    t, m = data.row(0)
    assert _trained_text(tokenizer, data, 0) == "four" + tokenizer.eos_token + "five" + tokenizer.eos_token
    assert not m[0] and t[-1] == tokenizer.eos_token_id and m[-1]


def test_mask_files_exclude_named_turns_or_merged_never_last_wins(tmp_path, tokenizer):
    f = write_jsonl(tmp_path / "c.jsonl", [chat("q1", "alpha", "q2", "beta"), chat("q3", "gamma", "q4", "delta")])
    m1 = write_jsonl(tmp_path / "m1.jsonl", [{"id": "c:1", "turns": [1]}])
    # The second file names the same record with another turn: both exclusions must hold.
    m2 = write_jsonl(tmp_path / "m2.jsonl", [{"id": "c:1", "turns": [3]}, {"id": "c:2", "turns": [3]}])
    for order in ([m1, m2], [m2, m1]):
        data = load_dataset(data_cfg(f, tmp_path, mask_files=[str(p) for p in order]), ModelConfig(), tokenizer)
        # c:1 has every answer excluded: no loss token left, so it is dropped and counted.
        assert data.ids == ["c:2"] and data.stats["dropped_no_loss"] == 1 and data.stats["no_loss_ids"] == ["c:1"]
        assert _trained_text(tokenizer, data, 0) == "gamma" + tokenizer.eos_token
    only1 = load_dataset(data_cfg(f, tmp_path, mask_files=[str(m1)]), ModelConfig(), tokenizer)
    assert _trained_text(tokenizer, only1, 0) == "beta" + tokenizer.eos_token


@pytest.mark.parametrize("line,match", [
    ({"id": "c:9", "turns": [1]}, "unknown record id 'c:9'"),
    ({"id": "c:1", "turns": [0]}, "turn 0 of c:1 is a 'user' turn"),
    ({"id": "c:1", "turns": [7]}, "turn 7 of c:1"),
    ({"id": "c:1"}, "a mask line must be"),
    ("{not json", "malformed JSON in mask file"),
])
def test_bad_mask_lines_are_refused_with_file_and_line(tmp_path, line, match):
    f = write_jsonl(tmp_path / "c.jsonl", [chat("q1", "alpha")])
    m = write_jsonl(tmp_path / "m.jsonl", [{"id": "c:1", "turns": [1]}, line])
    records = load_records(data_cfg(f, tmp_path))
    with pytest.raises(ConfigError, match=match) as e:
        load_mask_files([str(m)], records)
    assert str(e.value).startswith(f"{m}:2:")


def test_truncation_policies_and_report(tmp_path, tokenizer):
    rows = [chat("short", "ok"), chat("long " * 60, "answer " * 60), chat("q", "fine")]
    f = write_jsonl(tmp_path / "c.jsonl", rows)
    records = load_records(data_cfg(f, tmp_path))
    n_long = len(encode_records(records[1:2], tokenizer, data_cfg(f, tmp_path, max_seq_len=4096)).tokens)
    assert n_long > 64

    dropped = encode_records(records, tokenizer, data_cfg(f, tmp_path, max_seq_len=64, truncation="drop"))
    assert dropped.ids == ["c:1", "c:3"] and dropped.stats["dropped_too_long"] == 1
    assert dropped.stats["dropped_ids"] == ["c:2"]

    trunc = encode_records(records, tokenizer, data_cfg(f, tmp_path, max_seq_len=n_long - 20, truncation="truncate"))
    assert trunc.ids == ["c:1", "c:2", "c:3"] and trunc.stats["truncated"] == 1 and trunc.lengths[1] == n_long - 20
    assert trunc.stats["truncated_ids"] == ["c:2"] and trunc.row(1)[1].any()

    with pytest.raises(ConfigError, match=r"record c:2 has \d+ tokens, more than 64") as e:
        encode_records(records, tokenizer, data_cfg(f, tmp_path, max_seq_len=64, truncation="fail"))
    assert e.value.key == "data.max_seq_len"

    with pytest.raises(ConfigError, match="no record is left"):
        encode_records(records[1:2], tokenizer, data_cfg(f, tmp_path, max_seq_len=64, truncation="drop"))


def test_worker_processes_encode_exactly_what_in_process_encoding_does(tmp_path, tokenizer):
    rows = [chat(f"q{i} " + "word " * (i % 9), f"a{i} " + "more " * (i % 4), "next", f"b{i}") for i in range(40)]
    f = write_jsonl(tmp_path / "c.jsonl", rows)
    m = write_jsonl(tmp_path / "m.jsonl", [{"id": "c:3", "turns": [1]}])
    cfg = data_cfg(f, tmp_path, mask_files=[str(m)])
    records = load_records(cfg)
    excluded = load_mask_files(cfg.mask_files, records)
    serial = encode_records(records, tokenizer, cfg, excluded, workers=0)
    parallel = encode_records(records, tokenizer, cfg, excluded, workers=2)
    for a in ("tokens", "loss_mask", "offsets", "source_index"):
        assert np.array_equal(getattr(serial, a), getattr(parallel, a)), a
    assert serial.ids == parallel.ids and serial.roots == parallel.roots and serial.stats == parallel.stats


def _cache_is_empty(tmp_path) -> bool:
    d = tmp_path / "cache"
    return not d.exists() or not any(d.iterdir())


@pytest.mark.parametrize("case", ["malformed", "empty", "too_long", "unknown_mask_id"])
def test_bad_input_writes_nothing_into_the_cache(tmp_path, tokenizer, case):
    f = tmp_path / "c.jsonl"
    kw = {}
    if case == "malformed":
        write_jsonl(f, [chat("q", "a"), "{oops"])
    elif case == "empty":
        f.write_text("\n\n")
    elif case == "too_long":
        write_jsonl(f, [chat("q", "a"), chat("q " * 100, "a")])
        kw = dict(max_seq_len=32, truncation="fail")
    else:
        write_jsonl(f, [chat("q", "a")])
        kw = dict(mask_files=[str(write_jsonl(tmp_path / "m.jsonl", [{"id": "c:7", "turns": [1]}]))])
    with pytest.raises(ConfigError):
        load_dataset(data_cfg(f, tmp_path, **kw), ModelConfig(), tokenizer)
    assert _cache_is_empty(tmp_path)


def test_a_failed_cache_write_leaves_no_entry_and_no_temporary(tmp_path, tokenizer, monkeypatch):
    from align.data import encode_cache as cache_mod

    f = write_jsonl(tmp_path / "c.jsonl", [chat("q", "a")])
    calls = []

    def failing_save(path, arr):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        np.lib.format.write_array(open(path, "wb"), np.asanyarray(arr))

    monkeypatch.setattr(cache_mod.np, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        load_dataset(data_cfg(f, tmp_path), ModelConfig(), tokenizer)
    assert list((tmp_path / "cache").iterdir()) == []


def _die_mid_write(cfg, tokenizer):
    from align.data import encode_cache as cache_mod

    real_save, calls = np.save, []

    def save_then_die(path, arr):
        real_save(path, arr)
        calls.append(path)
        if len(calls) == 2:
            os._exit(3)  # a hard kill: no finally, no cleanup

    cache_mod.np.save = save_then_die
    load_dataset(cfg, ModelConfig(), tokenizer)


def test_a_writer_killed_mid_write_leaves_no_entry_a_reader_could_take(tmp_path, tokenizer):
    import multiprocessing

    f = write_jsonl(tmp_path / "c.jsonl", [chat("q", "a"), chat("q2", "b")])
    cfg = data_cfg(f, tmp_path)
    p = multiprocessing.get_context("fork").Process(target=_die_mid_write, args=(cfg, tokenizer))
    p.start()
    p.join(120)
    assert p.exitcode == 3
    entries = [d.name for d in (tmp_path / "cache").iterdir() if not d.name.startswith(".")]
    assert entries == [], f"a partial entry is visible: {entries}"
    first = load_dataset(cfg, ModelConfig(), tokenizer)
    again = load_dataset(cfg, ModelConfig(), tokenizer)
    assert (first.meta["cache_hit"], again.meta["cache_hit"]) == (False, True)
    assert np.array_equal(first.tokens, again.tokens)


@pytest.mark.parametrize("bad", [{"role": "assistant", "content": None}, {"role": "wizard", "content": "w"}])
def test_a_bad_chat_writes_no_cache_entry_and_skip_counts_it_in_the_meta(tmp_path, tokenizer, bad):
    f = write_jsonl(tmp_path / "c.jsonl", [chat("q", "a"), {"messages": [{"role": "user", "content": "q"}, bad]}])
    with pytest.raises(ConfigError, match=f"{f}:2: "):
        load_dataset(data_cfg(f, tmp_path), ModelConfig(), tokenizer)
    assert _cache_is_empty(tmp_path)
    data = load_dataset(data_cfg(f, tmp_path, on_bad_record="skip"), ModelConfig(), tokenizer)
    # the meta is what the manifest records as data.encode_meta
    assert data.ids == ["c:1"] and data.meta["skipped_bad"] == 1
    assert data.stats["skipped_where"][0].startswith(f"{f}:2: ")
    assert "None" not in tokenizer.decode(data.tokens.tolist())
