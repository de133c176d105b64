"""Packed (padding-free) micro-batches compute exactly the logits of each document run alone, for
every family and every attention backend that trains on CPU (docs/pitfalls.md#1). Each case also runs a
negative control, the leak docs/pitfalls.md#1 describes (an all-ones mask beside packed position_ids), and
requires it to DISAGREE, so the comparison is shown able to fail.

flex_attention has no CPU backward in torch 2.13 and compiles each new shape slowly on a CPU:
its CPU forward parity is opt-in (ALIGN_TEST_FLEX_CPU=1); tests/gpu/test_packed_parity_gpu.py runs it
with backward on CUDA. OLMoE has no flex support at all (docs/pitfalls.md#4).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from align.config import AttentionConfig, AttnImpl, Family
from align.data.collate import collate
from align.data.encode import EncodedDataset
from align.models.family_table import FAMILIES
from tests.conftest import build_tiny

DOC_LENGTHS = [45, 13, 38]  # > gemma4 tiny's sliding window of 32, so the windowed layers are exercised


def packed_case(vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(8, vocab, size=n).astype(np.int32) for n in DOC_LENGTHS]
    offsets = np.concatenate([[0], np.cumsum(DOC_LENGTHS)])
    data = EncodedDataset(tokens=np.concatenate(docs), loss_mask=np.ones(offsets[-1], dtype=bool), offsets=offsets,
                          ids=["a", "b", "c"], roots=["r"] * 3)
    return docs, collate(data, np.arange(3), pad_id=0, pad_to_multiple_of=8, packed=True)


def check_parity(model, docs, batch, tol=1e-5, reference=None) -> None:
    reference = reference or model
    packed = model(**batch.model_inputs()).logits[0]
    o = 0
    for doc in docs:
        alone = reference(input_ids=torch.from_numpy(doc.astype(np.int64))[None].to(packed.device),
                          use_cache=False).logits[0]
        torch.testing.assert_close(packed[o : o + len(doc)], alone, atol=tol, rtol=tol)
        o += len(doc)
    # Negative control: a mask beside packed position_ids turns the block-diagonal mask off.
    leak = {**batch.model_inputs(), "attention_mask": torch.ones_like(batch.input_ids)}
    leaked = model(**leak).logits[0]
    later = slice(DOC_LENGTHS[0], sum(DOC_LENGTHS))
    assert not torch.allclose(leaked[later], packed[later], atol=1e-3), "the comparison could not have failed"


def _model(family: Family, impl: AttnImpl):
    m = build_tiny(family, AttentionConfig(implementation=impl)).model
    assert m.config._attn_implementation == impl.hf_name
    return m.train()  # as the trainer runs it: train mode is where a cache would be created


@pytest.mark.parametrize("impl", [AttnImpl.sdpa, AttnImpl.eager])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_packed_logits_equal_separate_logits(tokenizer, family, impl):
    model = _model(family, impl)
    docs, batch = packed_case(len(tokenizer))
    assert batch.attention_mask is None and batch.position_ids is not None
    check_parity(model, docs, batch)


# flex runs on CPU forward-only (no CPU backward in torch 2.13) and compiles for ~25 s per family:
# CI runs Mistral; Gemma-4 (sliding layers) is opt-in with ALIGN_TEST_FLEX_CPU=1. OLMoE has no flex.
_GEMMA_FLEX = pytest.mark.skipif(os.environ.get("ALIGN_TEST_FLEX_CPU") != "1",
                                 reason="flex on CPU: ~25 s compile per family; set ALIGN_TEST_FLEX_CPU=1")


@pytest.mark.slow
@pytest.mark.parametrize("family", [Family.mistral, pytest.param(Family.gemma4, marks=_GEMMA_FLEX)])
def test_packed_flex_forward_on_cpu(tokenizer, family):
    model = _model(family, AttnImpl.flex)
    ref = _model(family, AttnImpl.eager)
    ref.load_state_dict(model.state_dict())
    docs, batch = packed_case(len(tokenizer))
    with torch.no_grad():
        check_parity(model, docs, batch, tol=1e-4, reference=ref)
