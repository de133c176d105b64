"""GPU: `optimizer.compile=true` (torch.compile of torch's foreach AdamW, tensor learning rate, the clip
scale inside the graph) trains like the fused step, and a changing learning rate recompiles nothing.

    python -m pytest -q -m gpu tests/gpu/test_compiled_step_gpu.py
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import build_trainer

pytestmark = pytest.mark.gpu

ARGS = ("trainer.device=cuda", "model.preset=tiny", "trainer.max_steps=8", "optimizer.lr=1e-2",
        "optimizer.max_grad_norm=0.5", "optimizer.warmup_ratio=0.5", "allow_dirty=true",
        "trainer.compile=false", "optimizer.compile=false")  # the fused baseline; the compiled run turns one on


def test_the_compiled_step_trains_like_the_fused_step_and_a_schedule_recompiles_nothing(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # graphs and shape decisions of earlier tests in this process do not count
    fused = build_trainer(tmp_path / "fused", *ARGS)
    init = {n: p.detach().clone() for n, p in fused.model.named_parameters()}
    assert fused.fit() == 0
    comp = build_trainer(tmp_path / "compiled", *ARGS, "optimizer.compile=true")
    assert comp.model_info["optimizer_step"]["kind"] == "compiled"
    batches = iter(comp.stream)
    graphs = []
    rows = []
    for _ in range(8):
        m, _ = comp.train_step(batches)
        rows.append(m)
        graphs.append(counters["stats"]["unique_graphs"])
    ref = [json.loads(x) for x in (fused.run_dir / "history.jsonl").read_text().splitlines()]
    assert len({r["lr"] for r in rows}) >= 4  # the warm-up changed the learning rate every step
    assert any(r["clipped"] for r in rows)  # the scaled graph ran
    assert graphs[-1] == graphs[3], graphs  # nothing compiled after the first steps
    for a, b in zip(ref, rows):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)
    # Adam divides by sqrt(v): where a gradient is ~0 the two implementations' last-bit differences
    # move single elements by up to ~lr, so the parameters' difference is held against what training
    # moved them (the losses above agree to 1e-4)
    for (n, p), q in zip(fused.model.named_parameters(), comp.model.parameters()):
        moved = float((p - init[n]).abs().mean())
        assert moved > 0 and float((q - p).abs().mean()) <= 0.02 * moved, n
