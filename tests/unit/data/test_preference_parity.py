"""Packed pairs never attend across sequences: the per-sequence summed log-probs a preference loss reads
(an index_add of per-token log-probs over `seq_ids`) are the same from a packed micro-batch, from a
padded one (with or without its attention mask) and from each sequence run alone; fp32 on CPU, tiny
models. Two deliberate leaks (a mask beside packed position_ids; positions that do not restart per
sequence) must change them, so the comparison is shown able to fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from align.config import AttentionConfig, AttnImpl, Family
from align.data.collate import Batch
from align.data.pairs import collate_pairs
from align.data.preference import EncodedPairs, load_pairs
from tests.conftest import build_tiny
from tests.unit.data.test_preference import train_cfg

ROWS = np.array([6, 7, 0, 1, 10, 11, 2, 3])  # four pairs, not in order
TOL = dict(rtol=1e-6, atol=1e-4)  # sums of some 100 fp32 log-probs, each near -log(vocab)


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor, seq_ids: torch.Tensor, n: int) -> torch.Tensor:
    """Summed target log-prob of each of the n sequences: exactly what the preference objective computes."""
    logp = torch.log_softmax(logits.float(), -1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    keep = seq_ids >= 0
    return torch.zeros(n, dtype=logp.dtype).index_add(0, seq_ids[keep], logp[keep])


def batch_logps(model, b: Batch, **override) -> torch.Tensor:
    with torch.no_grad():
        logits = model(**{**b.model_inputs(), **override}).logits
    return sequence_logps(logits, b.labels, b.seq_ids, 2 * b.pairs)


def alone_logps(model, pairs: EncodedPairs, rows) -> torch.Tensor:
    out = []
    for r in rows:
        t, m = pairs.row(int(r))
        ids = torch.from_numpy(t.astype(np.int64))[None]
        labels = torch.from_numpy(np.where(m[1:], t[1:], -100).astype(np.int64))
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0, :-1]
        out.append(sequence_logps(logits, labels, torch.where(labels >= 0, 0, -1), 1)[0])
    return torch.stack(out)


@pytest.fixture(scope="module")
def pairs(tokenizer, tmp_path_factory) -> EncodedPairs:
    return load_pairs(train_cfg(tmp_path_factory.mktemp("parity"), max_records=8), tokenizer)


def _model(family: Family, impl: AttnImpl):
    m = build_tiny(family, AttentionConfig(implementation=impl)).model
    return m.train()  # as the trainer runs it; the models have no dropout, so train mode is deterministic


@pytest.mark.parametrize("family,impl", [(Family.mistral, AttnImpl.sdpa), (Family.mistral, AttnImpl.eager),
                                         (Family.gemma4, AttnImpl.sdpa)], ids=lambda v: v.value)
def test_packed_and_padded_pairs_give_the_same_sequence_logps(tokenizer, pairs, family, impl):
    model = _model(family, impl)
    lens = pairs.lengths[ROWS]
    assert len(set(lens.tolist())) > 2, "unequal lengths: padding and packing offsets must both be exercised"
    if family == Family.gemma4:
        assert lens.min() > model.config.sliding_window, "the sliding-window layers must bind"
    padded = collate_pairs(pairs, ROWS, tokenizer.pad_token_id, 8)
    unmasked = collate_pairs(pairs, ROWS, tokenizer.pad_token_id, 8, mask_padding=False)
    packed = collate_pairs(pairs, ROWS, tokenizer.pad_token_id, 8, packed=True)
    assert padded.attention_mask is not None and unmasked.attention_mask is None and packed.attention_mask is None

    alone = alone_logps(model, pairs, ROWS)
    for b in (padded, unmasked, packed):
        torch.testing.assert_close(batch_logps(model, b), alone, **TOL)
    # The pair views the loss takes: chosen and rejected sums of pair p.
    got = batch_logps(model, packed)
    torch.testing.assert_close(got[packed.chosen_seq], alone[0::2], **TOL)
    torch.testing.assert_close(got[packed.rejected_seq], alone[1::2], **TOL)

    # Negative controls: each leak lets later sequences see earlier ones, and the sums move.
    leaks = {"mask beside packed position_ids": dict(attention_mask=torch.ones_like(packed.input_ids)),
             "positions that do not restart": dict(position_ids=torch.arange(packed.input_ids.shape[1])[None])}
    for what, override in leaks.items():
        leaked = batch_logps(model, packed, **override)
        assert torch.allclose(leaked[0], alone[0], **TOL), f"{what}: the first sequence has nothing to its left"
        assert not torch.allclose(leaked[1:], alone[1:], rtol=0, atol=1e-2), f"{what}: the comparison could not fail"
