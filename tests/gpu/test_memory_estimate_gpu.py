"""GPU: preflight's training-memory estimate against the peak a short run really allocates
(`torch.cuda.max_memory_allocated`), for small presets of the three shapes the estimate is held to on
the documented full-size peaks (tests/unit/plan/test_memory_vs_measured.py): a dense model under bf16
autocast, an MoE model with activation checkpointing and a chunked loss, and Gemma-4's MoE with LoRA.

    python -m pytest -q -m gpu tests/gpu/test_memory_estimate_gpu.py -s    # prints estimate / peak per row
"""

from __future__ import annotations

import gc

import pytest
import torch

from tests.conftest import build_trainer

pytestmark = pytest.mark.gpu

COMMON = ("trainer.device=cuda", "model.preset=small", "trainer.max_steps=4", "allow_dirty=true",
          "trainer.export=false", "sampler=budget", "sampler.max_tokens=8192", "sampler.mask_padding=false",
          "data.max_seq_len=1024")
CONFIGS = {
    "dense": ("model=mistral",),
    "moe_ac_chunked": ("model=olmoe", "model.dtype=bfloat16", "parallel.activation_checkpointing=true",
                       "trainer.loss_chunk_tokens=2048"),
    "gemma4_moe_lora": ("model=gemma4_moe", "model.dtype=bfloat16", "model.lora.enabled=true",
                        "parallel.activation_checkpointing=true", "trainer.loss_chunk_tokens=2048"),
}


def measure(tmp_path, *overrides: str) -> tuple[float, float, str]:
    """(estimate GiB, measured peak GiB above what was allocated before the build, the estimate's line)."""
    from align.plan.memory import GiB, estimate_memory

    gc.collect()  # an earlier case's trainer, held by reference cycles, is freed now, not during this build
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    trainer = build_trainer(tmp_path, *COMMON, *overrides)
    est = estimate_memory(trainer.cfg, torch.device("cuda"))
    assert trainer.fit() == 0
    top, now = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
    peak = (top - before) / GiB
    assert peak > 0, f"no allocation above the {before} bytes held before the build: max {top}, now {now}"
    del trainer
    return est.total / GiB, peak, est.line()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_estimate_is_within_25_percent_of_the_peak_a_run_allocates(tmp_path, name):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    est, peak, line = measure(tmp_path, *CONFIGS[name])
    print(f"{name}: estimate {est:.2f} GiB, peak {peak:.2f} GiB ({est / peak:.2f}x): {line}")
    assert 0.75 <= est / peak <= 1.25, (name, est, peak, line)
