"""On CUDA: trainer.compile_loss's inductor-compiled chunk passes (align/objectives/ce.py `chunk_terms`)
give the eager chunked loss's value and gradients at a Gemma-like head (a 30.0 soft-cap, bf16 hidden
states and head), and use less memory per chunk than the eager passes.
Run: pytest -q -m gpu tests/gpu/test_compiled_chunk_ce_gpu.py"""

from __future__ import annotations

import pytest
import torch

from align.objectives.ce import ChunkedCE

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_inductor_chunk_passes_match_the_eager_ones_and_hold_less(softcap):
    dev, vocab, dim, chunk = torch.device("cuda"), 65_536, 512, 2048
    torch.manual_seed(0)
    head = torch.nn.Linear(dim, vocab, bias=False, device=dev, dtype=torch.bfloat16)
    hidden = torch.randn(5000, dim, device=dev, dtype=torch.bfloat16)  # chunks of 2048, 2048 and 904
    labels = torch.randint(0, vocab, (5000,), device=dev)
    out, peaks = [], []
    for compiled in (False, True, True):  # the second compiled pass runs warm: its peak is the kernels'
        head.weight.grad = None
        h = hidden.clone().requires_grad_()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = ChunkedCE(head, chunk, softcap, compiled=compiled)(h, labels)
        loss.backward()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        out.append((loss.detach(), h.grad.float(), head.weight.grad.float()))
    (le, he, we), (lc, hc, wc) = out[0], out[2]
    torch.testing.assert_close(lc, le, rtol=1e-5, atol=1e-3)
    # bf16 gradients from fp32 math fused differently: a rounding step of bf16 apart at most
    torch.testing.assert_close(hc, he, rtol=2e-2, atol=1e-5)
    torch.testing.assert_close(wc, we, rtol=2e-2, atol=1e-4)
    assert peaks[2] < peaks[0], peaks
