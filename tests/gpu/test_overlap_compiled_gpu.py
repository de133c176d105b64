"""GPU: `optimizer.overlap=true` with `optimizer.compile=true` (each decoder block's chunk stepped by
the compiled AdamW on a side stream) trains bit-identically to the compiled step over all
parameters at once, every chunk stays compiled (7 chunks here: more than dynamo's default
recompile limit allows at two graphs per chunk), and a schedule recompiles nothing. Per-step rows,
graph counts and the manifest's `optimizer_step` go to $OUT/overlap_compiled.json (default
./outputs/gpu).

    python -m pytest -q -m gpu tests/gpu/test_overlap_compiled_gpu.py -s
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; before cuBLAS starts

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.conftest import build_trainer  # noqa: E402

pytestmark = pytest.mark.gpu

STEPS = 8
ARGS = ("trainer.device=cuda", "model.preset=tiny", "+model.overrides.num_hidden_layers=6",
        f"trainer.max_steps={STEPS}", "optimizer.lr=1e-2", "optimizer.max_grad_norm=0.5", "optimizer.warmup_ratio=0.5",
        "allow_dirty=true", "trainer.deterministic=true", "optimizer.compile=true",
        "trainer.compile=false")  # eager blocks in both runs: overlap refuses compiled ones


def train(tmp_path, *overrides):
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # each run's graphs counted from nothing
    t = build_trainer(tmp_path, *ARGS, *overrides)
    batches = iter(t.stream)
    before = counters["stats"]["unique_graphs"]
    rows, graphs = [], []
    for _ in range(STEPS):
        m, _ = t.train_step(batches)
        rows.append(m)
        graphs.append(counters["stats"]["unique_graphs"] - before)
    t.stepper.sync()
    torch.cuda.synchronize()
    update_code = torch.optim.Adam.step.__wrapped__.__code__
    entries = len(torch._dynamo.eval_frame._debug_get_cache_entry_list(update_code))
    limit_hit = [k.splitlines()[0] for k in counters["unimplemented"] if "recompile limit" in k.lower()]
    params = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    return t, rows, params, {"graphs": graphs, "update_cache_entries": entries, "limit_hit": limit_hit}


def test_overlapped_compiled_step_is_bit_identical_to_the_compiled_step_and_keeps_every_chunk_compiled(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    comp, rows_a, pa, ga = train(tmp_path / "compiled")
    over, rows_b, pb, gb = train(tmp_path / "overlap_compiled", "optimizer.overlap=true")
    _, rows_c, pc, _ = train(tmp_path / "compiled_again")  # control: two compiled runs must agree, or this says nothing
    info = over.model_info["optimizer_step"]
    out = Path(os.environ.get("OUT", "outputs/gpu"))
    out.mkdir(parents=True, exist_ok=True)
    keys = ("step", "loss", "grad_norm", "lr", "clipped")
    (out / "overlap_compiled.json").write_text(json.dumps({
        "torch": torch.__version__, "optimizer_step": info, "compiled": ga, "overlap_compiled": gb,
        "rows_compiled": [{k: r[k] for k in keys} for r in rows_a],
        "rows_overlap_compiled": [{k: r[k] for k in keys} for r in rows_b]}, indent=1))
    print(json.dumps({"optimizer_step": info, "compiled": ga, "overlap_compiled": gb}))

    assert [r["loss"] for r in rows_a] == [r["loss"] for r in rows_c] and all(torch.equal(pa[n], pc[n]) for n in pa)
    assert comp.model_info["optimizer_step"]["kind"] == "compiled"
    n = info["chunks"]
    assert info["kind"] == "overlap+compiled" and info["compiled"] and info["overlap"] and n == 7
    assert info["recompile_limit"] >= 2 * n > 8  # the default limit would have sent chunks to eager
    # a schedule, and the scaled graphs
    assert len({r["lr"] for r in rows_b}) >= 4 and any(r["clipped"] for r in rows_b)
    # every chunk compiled (the update's cache holds at least one entry per chunk, within the limit
    # raised for them), nothing past the limit, and nothing compiled once settled although the lr moves
    assert not gb["limit_hit"] and n <= gb["update_cache_entries"] <= info["recompile_limit"], gb
    # each variant (clipped or not) is traced again once the optimizer state is complete (step >= 1)
    settled = max(next(i for i in range(1, STEPS) if rows_b[i]["clipped"] == c)
                  for c in {r["clipped"] for r in rows_b[1:]})
    assert settled <= STEPS - 3 and gb["graphs"][-1] == gb["graphs"][settled], gb["graphs"]
    assert [r["loss"] for r in rows_a] == [r["loss"] for r in rows_b]
    assert [r["grad_norm"] for r in rows_a] == [r["grad_norm"] for r in rows_b]
    diffs = {k: float((pa[k].float() - pb[k].float()).abs().max()) for k in pa if not torch.equal(pa[k], pb[k])}
    assert not diffs, diffs
