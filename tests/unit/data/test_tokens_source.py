"""A pre-tokenized source (`data.source=tokens`): rows are encoded as given, every token after the
first is a target unless the row carries a loss_mask, and the cache key covers the field name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from align.config import to_typed
from align.data.cache import cache_key_parts, load_dataset
from align.data.collate import IGNORE, collate
from align.data.tokenizer import load_tokenizer
from align.errors import ConfigError
from align.run.cli import compose


def _cfg(tmp_path, path, *extra):
    return to_typed(compose(["data=tokens", f"data.path={path}", f"data.cache_dir={tmp_path / 'cache'}", *extra]))


def test_token_rows_are_encoded_as_given(tmp_path):
    f = tmp_path / "rows.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"input_ids": [5, 6, 7, 8]},
        {"input_ids": [9, 10, 11], "loss_mask": [0, 0, 1]},
    ]) + "\n")
    cfg = _cfg(tmp_path, f)
    data = load_dataset(cfg.data, cfg.model, load_tokenizer(cfg.model))
    assert data.lengths.tolist() == [4, 3]
    t0, m0 = data.row(0)
    assert t0.tolist() == [5, 6, 7, 8] and m0.tolist() == [False, True, True, True]
    assert data.row(1)[1].tolist() == [False, False, True]
    b = collate(data, np.array([0, 1]), pad_id=0)
    assert b.labels.tolist() == [[6, 7, 8, IGNORE], [IGNORE, 11, IGNORE, IGNORE]]


def test_tokens_field_is_part_of_the_cache_key(tmp_path):
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps({"input_ids": [1, 2, 3], "ids": [1, 2]}) + "\n")
    a = cache_key_parts(_cfg(tmp_path, f).data, _cfg(tmp_path, f).model)["key"]
    b = cache_key_parts(_cfg(tmp_path, f, "data.tokens_field=ids").data, _cfg(tmp_path, f).model)["key"]
    assert a != b


def test_a_row_without_token_ids_names_file_and_line(tmp_path):
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps({"input_ids": [1, 2]}) + "\n" + json.dumps({"text": "hi"}) + "\n")
    cfg = _cfg(tmp_path, f)
    with pytest.raises(ConfigError, match=r"rows\.jsonl:2.*input_ids"):
        load_dataset(cfg.data, cfg.model, load_tokenizer(cfg.model))
