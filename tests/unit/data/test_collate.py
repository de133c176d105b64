"""Collate: right padding with optional rounding, NO attention mask when nothing is padded, labels
shifted within each row; packed rows restart position_ids per document and never carry a mask."""

from __future__ import annotations

import numpy as np
import torch

from align.data.collate import IGNORE, collate
from align.data.encode import EncodedDataset


def dataset(rows) -> EncodedDataset:
    toks = [np.asarray(t, dtype=np.int32) for t, _ in rows]
    masks = [np.asarray(m, dtype=bool) for _, m in rows]
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in toks])])
    return EncodedDataset(tokens=np.concatenate(toks), loss_mask=np.concatenate(masks), offsets=offsets,
                          ids=[str(i) for i in range(len(rows))], roots=["r"] * len(rows))


DATA = dataset([([1, 2, 3, 4], [0, 0, 1, 1]), ([5, 6, 7, 8], [0, 1, 1, 1]), ([9, 10, 11], [0, 1, 1])])


def test_no_padding_means_no_attention_mask():
    b = collate(DATA, np.array([0, 1]), pad_id=0)
    assert b.attention_mask is None and "attention_mask" not in b.model_inputs()
    assert b.model_inputs()["use_cache"] is False
    assert b.labels.tolist() == [[IGNORE, 3, 4, IGNORE], [6, 7, 8, IGNORE]]
    assert (b.tokens, b.real_tokens, b.loss_tokens) == (8, 8, 5)


def test_padding_gets_a_mask_and_rounds_to_a_multiple():
    b = collate(DATA, np.array([0, 2]), pad_id=0, pad_to_multiple_of=8)
    assert b.input_ids.shape == (2, 8) and b.input_ids[1].tolist() == [9, 10, 11, 0, 0, 0, 0, 0]
    assert b.attention_mask.tolist() == [[1] * 4 + [0] * 4, [1] * 3 + [0] * 5]
    assert torch.equal(b.model_inputs()["attention_mask"], b.attention_mask)
    assert b.labels[1].tolist() == [10, 11] + [IGNORE] * 6
    assert (b.tokens, b.real_tokens) == (16, 7)
    # Rounding alone also pads: a 4-token row rounded to 8 must carry a mask.
    assert collate(DATA, np.array([0, 1]), pad_id=0, pad_to_multiple_of=8).attention_mask is not None


def test_packed_rows_restart_positions_and_never_carry_a_mask():
    b = collate(DATA, np.array([2, 0, 1]), pad_id=0, pad_to_multiple_of=4, packed=True)
    assert b.input_ids.tolist() == [[9, 10, 11, 1, 2, 3, 4, 5, 6, 7, 8, 0]]
    assert b.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 0]]
    # the last token of a document predicts nothing (never the next document's first token)
    assert b.labels.tolist() == [[10, 11, IGNORE, IGNORE, 3, 4, IGNORE, 6, 7, 8, IGNORE, IGNORE]]
    kw = b.model_inputs()
    assert "attention_mask" not in kw and kw["use_cache"] is False and torch.equal(kw["position_ids"], b.position_ids)
    assert (b.tokens, b.real_tokens, b.loss_tokens) == (12, 11, 7)
