"""attention=layered: chunked attention equals exact attention, the model's logits equal the eager
reference on both layer types (within and past the window, padded and not), each layer type takes
the path the manifest's plan names, and the mask gate checks what the layers get."""

from __future__ import annotations

import pytest
import torch

import align.models.layered_attention as la
from align.config import AttentionConfig, AttnImpl, Family
from tests.unit.models.conftest import batch, perturb_


def _exact(q, k, v, allowed, scale):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    return s.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("q_len, k_len, chunk", [(10, 10, 3), (10, 10, 64), (4, 10, 3)])
def test_chunked_attention_is_exact_causal_attention_with_gqa(q_len, k_len, chunk):
    g = torch.Generator().manual_seed(0)
    shapes = ((4, q_len), (2, k_len), (2, k_len))
    q, k, v = (torch.randn(2, h, n, 8, generator=g, dtype=torch.float64) for h, n in shapes)
    qi = torch.arange(k_len - q_len, k_len)[:, None]
    causal = torch.arange(k_len)[None, :] <= qi
    got = la.chunked_attention(q, k, v, None, 0.3, chunk=chunk)
    torch.testing.assert_close(got, _exact(q, k, v, causal, 0.3))


def test_chunked_attention_applies_a_boolean_or_additive_mask():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, h, 9, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    allowed = (torch.arange(9)[None, :] <= torch.arange(9)[:, None]) & (torch.arange(9)[:, None] - torch.arange(9) < 4)
    allowed = allowed[None, None].expand(2, 1, 9, 9).clone()
    allowed[1, :, :, 7:] = False  # padding keys in row 1
    allowed[1, :, 7:, :] = allowed[1, :, 6:7, :]  # padding queries see what the last real one does
    want = _exact(q, k, v, allowed, 0.5)
    torch.testing.assert_close(la.chunked_attention(q, k, v, allowed, 0.5, chunk=4), want)
    additive = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
    torch.testing.assert_close(la.chunked_attention(q, k, v, additive, 0.5, chunk=4), want)


@pytest.fixture
def paths(monkeypatch):
    """Which kernel path each call took, by (layer type, path), read from spies on the three paths;
    the chunked threshold lowered so the tiny presets' global layers (head_dim 64) take it, as the
    full model's (512) do."""
    import transformers.integrations.flex_attention as flex_mod
    import transformers.integrations.sdpa_attention as sdpa_mod

    seen: set[tuple[str, str]] = set()
    monkeypatch.setattr(la, "FLASH_MAX_HEAD_DIM", 32)
    for mod, name, path in ((sdpa_mod, "sdpa_attention_forward", "sdpa"), (flex_mod, "flex_attention_forward", "flex")):
        real = getattr(mod, name)

        def spy(module, *a, _real=real, _path=path, **kw):
            seen.add((module.layer_type, _path))
            return _real(module, *a, **kw)
        monkeypatch.setattr(mod, name, spy)
    real_forward, real_chunked = la.layered_attention_forward, la.chunked_attention
    current: list[str] = []

    def chunked(*a, **kw):
        seen.add((current[-1], "chunked"))
        return real_chunked(*a, **kw)

    def forward(module, *a, **kw):
        current.append(module.layer_type)
        return real_forward(module, *a, **kw)
    monkeypatch.setattr(la, "chunked_attention", chunked)
    monkeypatch.setattr(la, "layered_attention_forward", forward)  # what build's register() installs
    yield seen
    monkeypatch.undo()
    la.register()


@pytest.mark.parametrize("family", [Family.gemma4, Family.gemma4_moe])
@pytest.mark.parametrize("width, pad", [(24, 0), (48, 0), (48, 5)])  # tiny window: 32
def test_layered_logits_equal_eager_attention_on_both_layer_types(build, family, width, pad, paths):
    eager = perturb_(build(family, AttentionConfig(implementation=AttnImpl.eager)).model).eval()
    layered = build(family, AttentionConfig(implementation=AttnImpl.auto)).model.eval()
    layered.load_state_dict(eager.state_dict())
    assert layered.config._attn_implementation == la.NAME
    ids, mask = batch(eager.config.vocab_size, s=width, pad_last=pad)
    with torch.no_grad():
        want = eager(input_ids=ids, attention_mask=mask, use_cache=False).logits
        got = layered(input_ids=ids, attention_mask=mask, use_cache=False).logits
    real = mask.bool() if mask is not None else torch.ones(ids.shape, dtype=torch.bool)
    torch.testing.assert_close(got[real], want[real], atol=2e-5, rtol=1e-4)
    assert ("full_attention", "chunked") in paths and ("sliding_attention", "sdpa") in paths


def test_the_plan_names_each_layer_types_kernel(build):
    info = build(Family.gemma4_moe).info["attention_layers"]
    assert info["sliding_attention"]["window"] == 32 and info["sliding_attention"]["layers"] == 3
    assert "flex_attention" in info["sliding_attention"]["past_window"]
    assert info["full_attention"]["layers"] == 1 and info["full_attention"]["head_dim"] == 64
    assert info["full_attention"]["unpadded"].startswith("sdpa")  # 64 <= flash's 256
    from transformers import Gemma4TextConfig

    from align.models.registry import _GEMMA4_MOE

    full = la.plan(Gemma4TextConfig(**_GEMMA4_MOE["full"]))
    assert full["full_attention"]["unpadded"].startswith("chunked") and full["full_attention"]["head_dim"] == 512
    assert full["sliding_attention"]["head_dim"] == 256 and full["sliding_attention"]["layers"] == 25


def test_the_mask_gate_checks_the_layered_masks(build, tokenizer):
    """Past the window a sliding layer must see at most `window` keys: a mask function that drops
    the window is caught by the gate (align/probes/mask.py), not inferred from speed."""
    from align.data.collate import collate
    from align.probes.mask import mask_report

    model = build(Family.gemma4_moe).model.eval()
    import numpy as np

    from align.data.encode import EncodedDataset

    L = 48
    data = EncodedDataset(tokens=np.arange(3, 3 + 2 * L) % 500 + 3, loss_mask=np.ones(2 * L, dtype=bool),
                          offsets=np.array([0, L, 2 * L]), ids=["a", "b"], roots=["r", "r"])
    batches = {"unpadded": collate(data, np.arange(2), tokenizer.pad_token_id)}
    assert mask_report(model, batches)["ok"]
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def windowless(*a, **kw):
        kw["mask_function"] = lambda b, h, q, k: k <= q
        kw["local_size"] = None
        return sdpa_mask(*a, **kw)
    AttentionMaskInterface.register(la.NAME, windowless)
    try:
        assert not mask_report(model, batches)["ok"]
    finally:
        la.register()


def test_dropout_is_refused_on_the_chunked_path():
    q = torch.randn(1, 2, 4, 300)
    with pytest.raises(ValueError, match="dropout"):
        la.layered_attention_forward(torch.nn.Module(), q, q, q, None, dropout=0.1)


def test_a_sliding_layer_past_its_window_gets_a_block_mask_on_cuda_only():
    from transformers.masking_utils import sliding_window_causal_mask_function

    kw = dict(batch_size=1, q_length=48, kv_length=48, mask_function=sliding_window_causal_mask_function(32),
              local_size=32, allow_is_causal_skip=True)
    assert torch.is_tensor(la.layered_mask(**kw, device="cpu"))  # flex has no backward on CPU
    assert la.layered_mask(**{**kw, "q_length": 24, "kv_length": 24}, device="cpu") is None  # within: is_causal


@pytest.mark.parametrize("family", [Family.gemma4, Family.gemma4_moe])
def test_unread_kv_stores_are_dropped_and_change_nothing(build, family):
    """With no layer sharing keys and values, the last layer of each type still stored them: a write
    nobody reads and a second compiled graph per layer type. Turned off, the logits are the same."""
    from align.models.build import drop_unread_kv_stores

    b = build(family)
    assert b.info["kv_stores_dropped"] == 2  # the last sliding and the last full layer
    assert not any(getattr(m, "store_full_length_kv", False) for m in b.model.modules())
    stored = build(family).model
    for m in stored.modules():
        if hasattr(m, "store_full_length_kv"):
            m.store_full_length_kv = m.layer_idx in (2, 3)
    ids, _ = batch(b.model.config.vocab_size, s=40)
    with torch.no_grad():
        torch.testing.assert_close(b.model(input_ids=ids).logits, stored(input_ids=ids).logits, atol=0, rtol=0)
    shared = build(family).model
    for m in shared.modules():
        if hasattr(m, "store_full_length_kv"):
            m.store_full_length_kv, m.is_kv_shared_layer = m.layer_idx == 2, m.layer_idx == 3
    assert drop_unread_kv_stores(shared) == 0  # a layer reads them: kept
