"""sampler.mask_padding=false: right-padded micro-batches carry no attention mask, and nothing a loss
reads changes: real-token logits equal the masked ones for every family and CPU backend, gradients
of a training step are the same, and MoE router statistics still leave padding out."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from align.config import AttnImpl
from align.data.collate import collate
from align.data.encode import EncodedDataset
from align.models.family_table import FAMILIES
from tests.conftest import build_trainer
from tests.unit.data.test_packed_parity import _model


def _padded_case(vocab: int, lengths=(29, 17, 8), seed: int = 0):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(8, vocab, size=n).astype(np.int32) for n in lengths]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    data = EncodedDataset(tokens=np.concatenate(docs), loss_mask=np.ones(offsets[-1], dtype=bool), offsets=offsets,
                          ids=["a", "b", "c"], roots=["r"] * 3)
    return data, np.asarray(lengths)


@pytest.mark.parametrize("impl", [AttnImpl.sdpa, AttnImpl.eager])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_real_token_logits_do_not_need_the_padding_mask(tokenizer, family, impl):
    model = _model(family, impl)
    data, lengths = _padded_case(len(tokenizer))
    masked = collate(data, np.arange(3), pad_id=0, pad_to_multiple_of=8)
    bare = collate(data, np.arange(3), pad_id=0, pad_to_multiple_of=8, mask_padding=False)
    assert masked.attention_mask is not None and bare.attention_mask is None
    assert torch.equal(bare.padding_mask, masked.attention_mask) and torch.equal(bare.labels, masked.labels)
    a = model(**masked.model_inputs()).logits
    b = model(**bare.model_inputs()).logits
    for row, n in enumerate(lengths):
        torch.testing.assert_close(b[row, :n], a[row, :n], atol=1e-5, rtol=1e-5)
    # Negative control: the same rows padded on the LEFT without a mask do change (the check can fail).
    left = masked.input_ids.clone()
    for row, n in enumerate(lengths):
        left[row] = torch.roll(left[row], int(left.shape[1] - n))
    c = model(input_ids=left, use_cache=False).logits
    n = lengths[-1]
    assert not torch.allclose(c[-1, -n:], a[-1, :n], atol=1e-3)


def test_a_training_step_is_the_same_without_the_mask_and_moe_statistics_skip_padding(tmp_path):
    common = ["model=olmoe", "trainer.max_steps=2", "trainer.export=false", "optimizer.max_grad_norm=0",
              "data.max_records=48", "sampler=shuffle", "sampler.micro_batch_size=4"]
    seen = {}

    def capture(trainer, key):
        step = trainer.optimizer.step

        def wrapped(*a, **k):
            seen.setdefault(key, []).append([p.grad.clone() for p in trainer.model.parameters() if p.grad is not None])
            return step(*a, **k)

        trainer.optimizer.step = wrapped

    masked = build_trainer(tmp_path / "a", *common)
    bare = build_trainer(tmp_path / "b", *common, "sampler.mask_padding=false")
    capture(masked, "a")
    capture(bare, "b")
    assert masked.fit() == bare.fit() == 0
    for ga, gb in zip(seen["a"][0], seen["b"][0]):
        torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-6)
    rows = [json.loads((tmp_path / d / "run" / "history.jsonl").read_text().splitlines()[0]) for d in ("a", "b")]
    assert rows[0]["pad_waste"] > 0  # the batches were padded: the comparison could have differed
    moe_keys = [k for k in rows[0] if k.startswith("moe/")]
    assert moe_keys
    for k in moe_keys:
        assert rows[1][k] == pytest.approx(rows[0][k], rel=1e-5, abs=1e-6), k
