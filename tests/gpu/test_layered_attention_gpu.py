"""On CUDA: attention=layered (chunked matmul attention past the sliding window and on wide heads,
sdpa flash within it) is no further from the eager reference than transformers' own sdpa path, in
logits and gradients, under bf16 autocast as the trainer runs it.
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
