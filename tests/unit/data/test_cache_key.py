"""The encode cache key covers the MEANING of an encoding (docs/triage.md#8): a legitimate resume hits,
and any change that can change what the encoding means misses, including a mask file edited in
place at the same path."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from align.config import ModelConfig
from align.data import encode_cache as cache_mod
from align.data.encode_cache import ENCODE_VERSION, cache_key_parts, encode_cache_key, load_dataset
from align.data.tokenizer import bundled_tokenizer_dir
from tests.unit.data.conftest import data_cfg, write_jsonl

COMMON = dict(sources=[{"name": "s", "sha256": "a" * 64}], tokenizer_sha256="b" * 64, chat_template_sha256="c" * 64,
              max_seq_len=512, truncation="drop", on_bad_record="fail", max_records=None)


def test_encode_cache_key_separates_a_masked_run_from_an_unmasked_one():
    unmasked = encode_cache_key(**COMMON)
    masked = encode_cache_key(**COMMON, aux_sha256s=["d" * 64])
    assert unmasked != masked
    assert masked == encode_cache_key(**COMMON, aux_sha256s=["d" * 64])  # a legitimate resume still hits


@pytest.mark.parametrize("change", [
    dict(sources=[{"name": "s", "sha256": "e" * 64}]),
    dict(sources=[{"name": "s", "sha256": "a" * 64, "root_field": "topic"}]),
    dict(tokenizer_sha256="f" * 64),
    dict(chat_template_sha256="0" * 64),
    dict(max_seq_len=1024),
    dict(truncation="truncate"),
    dict(on_bad_record="skip"),
    dict(max_records=10),
    dict(encode_version=ENCODE_VERSION + 1),
    dict(libraries={"tokenizers": "0.0.1"}),
], ids=lambda c: next(iter(c)))
def test_every_input_of_meaning_changes_the_key(change):
    assert encode_cache_key(**{**COMMON, **change}) != encode_cache_key(**COMMON)


def test_mask_files_are_or_merged_so_their_order_is_not_in_the_key():
    a, b = "1" * 64, "2" * 64
    assert encode_cache_key(**COMMON, aux_sha256s=[a, b]) == encode_cache_key(**COMMON, aux_sha256s=[b, a])


def _parts(cfg, model=None):
    return cache_key_parts(cfg, model or ModelConfig())["key"]


def test_key_from_files_hits_on_a_resume_and_ignores_paths_and_cache_settings(corpus, tmp_path):
    mask = write_jsonl(tmp_path / "m.jsonl", [{"id": "corpus:1", "turns": [1]}])
    k1 = _parts(data_cfg(corpus, tmp_path, mask_files=[str(mask)]))
    assert k1 == _parts(data_cfg(corpus, tmp_path, mask_files=[str(mask)]))
    # The same content under another path, another cache dir or worker count means the same thing.
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    shutil.copy(corpus, moved / corpus.name)
    shutil.copy(mask, moved / "renamed.jsonl")
    assert k1 == _parts(data_cfg(moved / corpus.name, tmp_path, mask_files=[str(moved / "renamed.jsonl")],
                                 cache_dir=str(tmp_path / "other"), encode_workers=3))


def test_key_from_files_misses_on_in_place_edits(corpus, tmp_path):
    mask = write_jsonl(tmp_path / "m.jsonl", [{"id": "corpus:1", "turns": [1]}])
    cfg = data_cfg(corpus, tmp_path, mask_files=[str(mask)])
    k0 = _parts(cfg)
    write_jsonl(mask, [{"id": "corpus:1", "turns": [3]}])  # same path, new meaning
    k_mask = _parts(cfg)
    corpus.write_text(corpus.read_text() + json.dumps({"prompt": "p", "response": "r"}) + "\n")
    k_corpus = _parts(cfg)
    assert len({k0, k_mask, k_corpus}) == 3
    assert _parts(data_cfg(corpus, tmp_path, mask_files=[str(mask)], max_seq_len=300)) != k_corpus
    assert _parts(data_cfg(corpus, tmp_path, mask_files=[str(mask)], prompt_field="q")) != k_corpus
    assert _parts(data_cfg(corpus, tmp_path, mask_files=[])) != k_corpus


def test_key_covers_the_tokenizer_files_and_chat_template(corpus, tmp_path):
    tdir = tmp_path / "tok"
    shutil.copytree(bundled_tokenizer_dir(), tdir)
    (tdir / "config.json").write_text("{}")
    cfg = data_cfg(corpus, tmp_path)
    model = ModelConfig(pretrained=str(tdir))
    k0 = _parts(cfg, model)
    assert k0 == _parts(cfg, ModelConfig())  # same tokenizer content, another directory
    tpl = tdir / "chat_template.jinja"
    tpl.write_text(tpl.read_text().replace("<|end|>", "<|end|>\n"))
    k1 = _parts(cfg, model)
    assert k1 != k0
    tc = tdir / "tokenizer_config.json"
    tc.write_text(tc.read_text().replace('"model_max_length": 4096', '"model_max_length": 4097'))
    assert _parts(cfg, model) not in (k0, k1)


def test_load_dataset_hits_on_resume_and_misses_on_an_in_place_mask_edit(corpus, tmp_path, tokenizer):
    mask = write_jsonl(tmp_path / "m.jsonl", [{"id": "corpus:1", "turns": [1]}])
    cfg = data_cfg(corpus, tmp_path, mask_files=[str(mask)])
    first = load_dataset(cfg, ModelConfig(), tokenizer)
    again = load_dataset(cfg, ModelConfig(), tokenizer)
    assert (first.meta["cache_hit"], again.meta["cache_hit"]) == (False, True)
    assert np.array_equal(first.tokens, again.tokens) and np.array_equal(first.loss_mask, again.loss_mask)
    assert first.ids == again.ids and first.roots == again.roots
    assert first.meta["fingerprint"] == again.meta["fingerprint"]

    write_jsonl(mask, [{"id": "corpus:1", "turns": [3]}])  # edited in place: turn 3 instead of turn 1
    edited = load_dataset(cfg, ModelConfig(), tokenizer)
    assert edited.meta["cache_hit"] is False
    assert edited.meta["encode_cache_key"] != first.meta["encode_cache_key"]
    assert not np.array_equal(edited.loss_mask, first.loss_mask)
    assert edited.meta["fingerprint"] != first.meta["fingerprint"]


def test_meta_carries_the_provenance_the_manifest_records(corpus, tmp_path, tokenizer):
    mask = write_jsonl(tmp_path / "m.jsonl", [{"id": "corpus:1", "turns": [1]}])
    data = load_dataset(data_cfg(corpus, tmp_path, mask_files=[str(mask)], max_seq_len=30, truncation="truncate"),
                        ModelConfig(), tokenizer)
    m = data.meta
    for key in ("encode_cache_key", "encode_version", "cache_hit", "fingerprint", "tokenizer_sha256",
                "chat_template_sha256", "sources", "aux_files", "truncation", "skipped_bad", "libraries"):
        assert key in m, key
    assert m["encode_version"] == ENCODE_VERSION
    assert m["sources"][0]["sha256"] == cache_mod.sha256_file(corpus)
    assert m["aux_files"] == [{"path": str(mask), "sha256": cache_mod.sha256_file(mask)}]
    assert m["truncation"]["truncated"] > 0 and m["truncation"]["truncation_policy"] == "truncate"
    assert m["truncation"]["truncated"] == data.stats["truncated"] and max(data.lengths) == 30


def test_a_tokenizer_whose_template_differs_from_its_files_is_refused(corpus, tmp_path, tokenizer):
    from align.errors import ConfigError

    original = tokenizer.chat_template
    try:
        tokenizer.chat_template = original + " "
        with pytest.raises(ConfigError, match="chat template"):
            load_dataset(data_cfg(corpus, tmp_path), ModelConfig(), tokenizer)
    finally:
        tokenizer.chat_template = original


def test_preflight_key_is_the_key_the_run_uses(corpus, tmp_path, tokenizer):
    from align.config import TrainConfig
    from align.data.encode_cache import encode_cache_key_for

    cfg = TrainConfig(data=data_cfg(corpus, tmp_path))
    assert encode_cache_key_for(cfg) == load_dataset(cfg.data, cfg.model, tokenizer).meta["encode_cache_key"]
