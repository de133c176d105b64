"""GPU: router telemetry's batched pass at OLMoE-1B-7B's router shape (16 MoE layers, 64 experts,
top-8, 8192 tokens, bf16 logits). It equals the per-layer reference of the unit tests to 1e-12, runs
under `torch.use_deterministic_algorithms(True)` (int histc on CUDA) bit-identically, and the CUDA
kernels one forward's telemetry launches do not grow with the number of layers. Kernel counts and
telemetry milliseconds per forward (record on minus off, 16 routers) go to $OUT/moe_telemetry.json
(default ./outputs/gpu). About 20 s.

    OUT=... python -m pytest -q -m gpu tests/gpu/test_moe_telemetry_gpu.py -s
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from align.models.family_table import RouterTap
from align.telemetry.moe import RouterTelemetry, window_stats
from tests.unit.models.test_moe_telemetry import _assert_rows_equal, _Routers, per_layer_reference

pytestmark = pytest.mark.gpu

OUT = Path(os.environ.get("OUT", "outputs/gpu"))
L, T, E, K = 16, 8192, 64, 8


@pytest.fixture(scope="module")
def dev():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return torch.device("cuda")


def _routing(dev, layers=L, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    logits = (torch.randn(layers, T, E, generator=g, device=dev) * 2).bfloat16()
    mask = torch.rand(T, generator=g, device=dev) > 0.05
    return logits, torch.topk(logits.float(), K, -1).indices, mask


def _toy(layers, dev):
    model = _Routers(layers, K).train()
    taps = [RouterTap(i, r, lambda o: o[0], r, lambda o: o[2]) for i, r in enumerate(model.layers)]
    return model, RouterTelemetry(model, taps, E, K)


def _kernels_per_forward(model, tel, xs, mask, record: bool) -> int:
    from torch.profiler import ProfilerActivity, profile

    tel.record = record
    model(xs, attention_mask=mask)  # warm: the window exists, nothing lazy left
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(xs, attention_mask=mask)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _ms_per_forward(model, tel, xs, mask, record: bool, n: int = 50) -> float:
    tel.record = record
    for _ in range(5):
        model(xs, attention_mask=mask)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        model(xs, attention_mask=mask)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def test_batched_rows_equal_the_per_layer_reference_at_olmoe_shape(dev):
    logits, ids, mask = _routing(dev)
    _assert_rows_equal(window_stats(logits, ids, mask, E).cpu(), per_layer_reference(logits, ids, mask, E).cpu(), E)


def test_batched_rows_are_bit_identical_in_deterministic_mode(dev):
    logits, ids, mask = _routing(dev, seed=1)
    torch.use_deterministic_algorithms(True)
    try:
        rows = [window_stats(logits, ids, mask, E) for _ in range(3)]
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(rows[0], r) for r in rows[1:])


def test_telemetry_kernels_per_forward_do_not_grow_with_layers_and_cost_is_recorded(dev):
    out = {"shape": {"tokens": T, "experts": E, "top_k": K, "dtype": "bfloat16"}, "per_layers": {}}
    for layers in (4, L):
        logits, _, mask = _routing(dev, layers)
        xs = list(logits)
        model, tel = _toy(layers, dev)
        mask2d = mask[None].long()
        on = _kernels_per_forward(model, tel, xs, mask2d, True)
        off = _kernels_per_forward(model, tel, xs, mask2d, False)
        ms_on, ms_off = _ms_per_forward(model, tel, xs, mask2d, True), _ms_per_forward(model, tel, xs, mask2d, False)
        out["per_layers"][layers] = {"telemetry_kernels_per_forward": on - off,
                                     "telemetry_ms_per_forward": ms_on - ms_off,
                                     "forward_ms_record_on": ms_on, "forward_ms_record_off": ms_off}
        print(f"{layers} layers: telemetry {on - off} CUDA kernels, {ms_on - ms_off:.3f} ms per forward "
              f"({ms_on:.3f} on / {ms_off:.3f} off)")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "moe_telemetry.json").write_text(json.dumps(out, indent=1))
    k = {n: v["telemetry_kernels_per_forward"] for n, v in out["per_layers"].items()}
    assert k[4] > 0 and k[4] == k[L], k
