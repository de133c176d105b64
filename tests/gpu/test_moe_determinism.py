"""GPU: one MoE layer at OLMoE shape (E=64, k=8, 4096 tokens, bf16) is bit-identical over 8 repeats
with the experts kernel transformers picks by default (docs/pitfalls.md#20). Results, including the
default-mode backward and the eager / batched_mm kernels, go to $OUT/moe_determinism.json (default
./outputs/gpu) for the report.

    OUT=... python -m pytest -q -m gpu tests/gpu/test_moe_determinism.py -s
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # needed by deterministic mode; set before cuBLAS starts

import pytest  # noqa: E402
import torch  # noqa: E402

from align.config import Family  # noqa: E402
from align.models.determinism import repeat_check  # noqa: E402

pytestmark = pytest.mark.gpu

OUT = Path(os.environ.get("OUT", "outputs/gpu"))


@pytest.fixture(scope="module")
def results():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    r = {"default": repeat_check(Family.olmoe, experts=None, tokens=4096, repeats=8)}
    for e in ("eager", "batched_mm"):
        try:
            r[e] = repeat_check(Family.olmoe, experts=e, tokens=4096, repeats=8)
        except torch.OutOfMemoryError as err:  # batched_mm gathers a weight copy per token x expert slot
            r[e] = {"experts_resolved": e, "error": f"out of memory: {str(err).splitlines()[0]}",
                    "forward_bit_identical": None, "backward_bit_identical": None, "distinct_hashes": None}
            torch.cuda.empty_cache()
    torch.use_deterministic_algorithms(True)
    try:
        r["default_deterministic_mode"] = repeat_check(Family.olmoe, experts=None, tokens=4096, repeats=8)
    finally:
        torch.use_deterministic_algorithms(False)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "moe_determinism.json").write_text(json.dumps(r, indent=1))
    for name, x in r.items():
        print(f"{name}: experts {x['experts_resolved']}, forward identical {x['forward_bit_identical']}, "
              f"backward identical {x['backward_bit_identical']}, distinct hashes {x['distinct_hashes']}")
    return r


def test_default_experts_backend_forward_and_routing_are_bit_identical_over_8_repeats(results):
    r = results["default"]
    assert (r["num_experts"], r["top_k"], r["tokens"], r["dtype"], r["hidden"]) == (64, 8, 4096, "bfloat16", 2048)
    assert r["experts_requested"] is None and r["experts_resolved"] == "grouped_mm"
    assert r["forward_bit_identical"], r["distinct_hashes"]


def test_default_experts_backend_backward_is_bit_identical_in_deterministic_mode(results):
    r = results["default_deterministic_mode"]
    assert r["forward_bit_identical"] and r["backward_bit_identical"], r["distinct_hashes"]
