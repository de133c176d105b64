"""A pre-tokenized source (`data.source=tokens`): rows are encoded as given, every token after the
first is a target unless the row carries a loss_mask, and the cache key covers the field name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from align.config import to_typed
from align.data.collate import IGNORE, collate
from align.data.encode_cache import cache_key_parts, load_dataset
from align.errors import ConfigError
from align.run.cli import compose


def _cfg(tmp_path, path, *extra):
    return to_typed(compose(["data=tokens", f"data.path={path}", f"data.cache_dir={tmp_path / 'cache'}", *extra]))


def test_token_rows_are_encoded_as_given(tmp_path, tokenizer):
    f = tmp_path / "rows.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"input_ids": [5, 6, 7, 8]},
        {"input_ids": [9, 10, 11], "loss_mask": [0, 0, 1]},
    ]) + "\n")
    cfg = _cfg(tmp_path, f)
    data = load_dataset(cfg.data, cfg.model, tokenizer)
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


def test_a_row_without_token_ids_names_file_and_line(tmp_path, tokenizer):
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps({"input_ids": [1, 2]}) + "\n" + json.dumps({"text": "hi"}) + "\n")
    cfg = _cfg(tmp_path, f)
    with pytest.raises(ConfigError, match=r"rows\.jsonl:2.*input_ids"):
        load_dataset(cfg.data, cfg.model, tokenizer)


# bool is an int in Python: `true` was trained as id 1, and any truthy mask value as a target.
BAD_ROWS = [
    ({"input_ids": [True, 5, False]}, "'input_ids'[0] is true; accepted: a non-empty list of integer token ids"),
    ({"input_ids": [4, 5.0]}, "'input_ids'[1] is 5.0; accepted"),
    ({"input_ids": [4, -1]}, "'input_ids'[1] is -1; accepted"),
    ({"input_ids": []}, "field 'input_ids' is a list of 0; accepted"),
    ({"input_ids": [4, 5, 6], "loss_mask": [0, 2, 1]}, "'loss_mask'[1] is 2; accepted: 0 or 1 (or false/true)"),
    ({"input_ids": [4, 5, 6], "loss_mask": [0, 0.5, 1]}, "'loss_mask'[1] is 0.5; accepted: 0 or 1"),
    ({"input_ids": [4, 5, 6], "loss_mask": [0, "1", 1]}, "'loss_mask'[1] is \"1\"; accepted: 0 or 1"),
    ({"input_ids": [4, 5, 6], "loss_mask": [0, 1]}, "field 'loss_mask' is a list of 2; accepted: a list of 0/1 as "
                                                    "long as 'input_ids' (3)"),
]


@pytest.mark.parametrize("row,match", BAD_ROWS, ids=[str(i) for i in range(len(BAD_ROWS))])
def test_a_bad_token_row_names_file_and_line(tmp_path, row, match):
    from align.data.sources import load_records
    from tests.unit.data.conftest import data_cfg, write_jsonl

    f = write_jsonl(tmp_path / "rows.jsonl", [{"input_ids": [1, 2]}, row, {"input_ids": [3, 4]}])
    with pytest.raises(ConfigError) as e:
        load_records(data_cfg(f, tmp_path, source="tokens"))
    assert e.value.key == f"{f}:2" and match in e.value.message and "\n" not in str(e.value)
    report: dict = {}
    kept = load_records(data_cfg(f, tmp_path, source="tokens", on_bad_record="skip"), report)
    assert [r.tokens for r in kept] == [(1, 2), (3, 4)] and report["skipped_bad"] == 1
    assert report["skipped_where"][0].startswith(f"{f}:2: ")


def test_masks_take_0_1_and_false_true_exactly(tmp_path):
    from align.data.sources import load_records, top_token
    from tests.unit.data.conftest import data_cfg, write_jsonl

    f = write_jsonl(tmp_path / "rows.jsonl", [{"input_ids": [7, 8, 9], "loss_mask": [0, 1, 1]},
                                              {"input_ids": [70, 8, 9], "loss_mask": [True, False, True]}])
    a, b = load_records(data_cfg(f, tmp_path, source="tokens"))
    assert a.loss_mask == (False, True, True) and b.loss_mask == (True, False, True)
    assert top_token([a, b]) == (70, f"{f}:2")
