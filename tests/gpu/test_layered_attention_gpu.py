"""On CUDA: attention=layered (chunked matmul attention on wide heads, the flash kernel with the
window past the sliding window, sdpa flash within it) is no further from the eager reference than
transformers' own sdpa path, in logits and gradients, under bf16 autocast as the trainer runs it;
the windowed flash kernel equals the matmul band, and the mask gate reads its band.
Run: pytest -q -m gpu tests/gpu/test_layered_attention_gpu.py"""

from __future__ import annotations

import pytest
import torch

from align.config import AttentionConfig, AttnImpl, Family, ModelConfig
from tests.unit.models.conftest import batch, perturb_

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _run(model, ids):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=ids, use_cache=False).logits
    logits.float().logsumexp(-1).mean().backward()
    return logits.detach().float(), model.model.embed_tokens.weight.grad.clone()


@pytest.mark.parametrize("width", [24, 80])  # tiny window 32: within and past it
def test_layered_is_as_close_to_eager_as_sdpa_on_cuda(width):
    from align.data.tokenizer import load_tokenizer
    from align.models import build_model

    tok, dev = load_tokenizer(ModelConfig()), torch.device("cuda")
    cfg = ModelConfig(family=Family.gemma4_moe)
    torch.manual_seed(0)
    eager = perturb_(build_model(cfg, AttentionConfig(implementation=AttnImpl.eager), tok, dev).model).to(dev)
    ids = batch(eager.config.vocab_size, s=width)[0].to(dev)
    ref = _run(eager, ids)
    err = {}
    for impl in (AttnImpl.sdpa, AttnImpl.layered):
        m = build_model(cfg, AttentionConfig(implementation=impl), tok, dev).model.to(dev)
        m.load_state_dict(eager.state_dict())
        got = _run(m, ids)
        err[impl.value] = [float((g - r).abs().max()) for g, r in zip(got, ref)]
    print(err)
    for i in range(2):
        assert err["layered"][i] <= 2 * err["sdpa"][i] + 1e-6, err


def test_windowed_flash_equals_the_matmul_band_in_values_and_gradients():
    """The sliding layers past their window on CUDA: PyTorch's flash kernel with `window - 1` as its
    left bound against `chunked_attention` with the window in fp32, at Gemma-4's sliding shapes (16
    query heads over 8 key/value heads, head_dim 256, window 1024) on a row past the window."""
    import align.models.layered_attention as la

    g = torch.Generator(device="cuda").manual_seed(0)
    B, S, W = 2, 1100, 1024
    q, k, v = (torch.randn(B, S, h, 256, device="cuda", generator=g).transpose(1, 2) for h in (16, 8, 8))
    leaves = [t.to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
    ref_leaves = [t.detach().float().requires_grad_() for t in leaves]
    got = la.windowed_attention(*leaves, 0.0625, W)
    want = la.chunked_attention(*ref_leaves, None, 0.0625, window=W).transpose(1, 2)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
    got.float().square().sum().backward()
    want.square().sum().backward()
    for a, b in zip(leaves, ref_leaves):
        torch.testing.assert_close(a.grad.float(), b.grad, atol=5e-2, rtol=5e-2)
    # one key wider is a different band at this row length: the comparison above can tell
    wide = la.windowed_attention(*(t.detach() for t in leaves), 0.0625, W + 1)
    assert float((wide.float() - want.detach()).abs().max()) > 5e-2


def test_the_mask_gate_reads_the_flash_windows_band_in_bf16(monkeypatch):
    """On CUDA in bf16 an unpadded sliding layer past its window runs the flash kernel, and the gate
    reads its band from that kernel's output: right with the window, wrong one key wider."""
    import align.models.layered_attention as la
    from align.data.tokenizer import load_tokenizer
    from align.models import build_model
    from align.probes.mask import expected

    tok, dev = load_tokenizer(ModelConfig()), torch.device("cuda")
    model = build_model(ModelConfig(family=Family.gemma4_moe), AttentionConfig(implementation=AttnImpl.layered),
                        tok, dev).model.to(dev)
    sliding = next(m for m in model.modules() if getattr(m, "layer_type", None) == "sliding_attention")
    L, W = 80, model.config.sliding_window
    want = expected(torch.ones(1, L, dtype=torch.bool), W)[0]
    calls = []
    real = torch.ops.aten._flash_attention_forward

    def spy(*a, **kw):
        calls.append(kw.get("window_size_left"))
        return real(*a, **kw)
    monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward", spy)
    with torch.autocast("cuda", dtype=torch.bfloat16):  # as the trainer's gate runs it
        assert torch.equal(la.observed_band(sliding, L), want)
    assert calls and set(calls) == {W - 1}
    real_windowed = la.windowed_attention
    monkeypatch.setattr(la, "windowed_attention", lambda q, k, v, s, w, d=0.0: real_windowed(q, k, v, s, w + 1, d))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert not torch.equal(la.observed_band(sliding, L), want)
