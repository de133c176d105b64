"""GPU: one MoE layer at OLMoE shape (E=64, k=8, 4096 tokens, bf16) is bit-identical over 8 repeats
with the experts kernel transformers picks by default (seeds/004 section f). Results are written to
$OUT/moe_determinism.json (default ./outputs/gpu) for the report.

    pytest -q -m gpu tests/gpu/test_moe_determinism.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from align.config import Family
from align.models.determinism import repeat_check

pytestmark = pytest.mark.gpu

OUT = Path(os.environ.get("OUT", "outputs/gpu"))


@pytest.fixture(scope="module")
def default_backend():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    r = repeat_check(Family.olmoe, experts=None, tokens=4096, repeats=8)
    others = {e: repeat_check(Family.olmoe, experts=e, tokens=4096, repeats=8) for e in ("eager", "batched_mm")}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "moe_determinism.json").write_text(json.dumps({"default": r, **others}, indent=1))
    return r


def test_default_experts_backend_forward_and_routing_are_bit_identical_over_8_repeats(default_backend):
    r = default_backend
    assert (r["num_experts"], r["top_k"], r["tokens"], r["dtype"]) == (64, 8, 4096, "bfloat16")
    assert r["experts_requested"] is None and r["experts_resolved"] == "grouped_mm"
    assert r["forward_bit_identical"], r["distinct_hashes"]


def test_default_experts_backend_backward_is_bit_identical_over_8_repeats(default_backend):
    assert default_backend["backward_bit_identical"], default_backend["distinct_hashes"]
