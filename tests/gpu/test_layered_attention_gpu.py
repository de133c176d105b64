"""On CUDA: attention=layered (chunked matmul attention past the sliding window and on wide heads,
sdpa flash within it) matches the eager reference in logits and gradients, in bf16 autocast as the
trainer runs it. Run: pytest -q -m gpu tests/gpu/test_layered_attention_gpu.py"""

from __future__ import annotations

import pytest
import torch

from align.config import AttentionConfig, AttnImpl, Family, ModelConfig
from tests.unit.models.conftest import batch, perturb_

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("width", [24, 80])  # tiny window 32: within and past it
def test_layered_matches_eager_on_cuda_forward_and_backward(width):
    from align.data.tokenizer import load_tokenizer
    from align.models import build_model

    tok, dev = load_tokenizer(ModelConfig()), torch.device("cuda")
    cfg = ModelConfig(family=Family.gemma4_moe)
    torch.manual_seed(0)
    eager = perturb_(build_model(cfg, AttentionConfig(implementation=AttnImpl.eager), tok, dev).model).to(dev)
    layered = build_model(cfg, AttentionConfig(implementation=AttnImpl.layered), tok, dev).model.to(dev)
    layered.load_state_dict(eager.state_dict())
    ids, _ = batch(eager.config.vocab_size, s=width)
    ids = ids.to(dev)
    outs = []
    for m in (eager, layered):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = m(input_ids=ids, use_cache=False).logits
        logits.float().logsumexp(-1).mean().backward()
        outs.append((logits.detach().float(), m.model.embed_tokens.weight.grad.clone()))
    torch.testing.assert_close(outs[1][0], outs[0][0], atol=5e-2, rtol=2e-2)
    torch.testing.assert_close(outs[1][1], outs[0][1], atol=1e-3, rtol=5e-2)
