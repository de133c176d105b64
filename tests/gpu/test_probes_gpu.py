"""The probes on a CUDA device (run on the GPU machine: pytest -m gpu). Tiny model: checks that the
profiler reports device kernels and the ceiling is the bf16 GEMM, not performance."""

from __future__ import annotations

import json

import pytest
import torch

from align.config import to_typed

pytestmark = pytest.mark.gpu
SMALL = ["data.max_records=64", "logger=none", "allow_dirty=true", "trainer.device=cuda"]


@pytest.fixture(autouse=True)
def _needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def test_kernels_probe_sees_device_kernels(compose, tmp_path):
    from align.probes import kernels

    cfg = to_typed(compose(["probe=kernels", "probe.kernels.warmup=1", "probe.kernels.timed_steps=2",
                            "probe.kernels.steps=2", *SMALL], config_name="probe"))
    assert kernels.run(cfg, tmp_path) == 0
    r = json.loads((tmp_path / "kernels.json").read_text())
    t = r["kernel_table"]
    assert t["kernels"] and t["total_ms"] > 0 and t["launches_per_step"] > 0
    assert sum(g["pct"] for g in t["groups"].values()) == pytest.approx(1.0)
    assert t["groups"]["gemm"]["ms"] > 0
    assert not any(k["name"].startswith("aten::") for k in t["kernels"])
    # the naive table double counts; the kernel table does not
    assert t["unfiltered_ms"] > 1.5 * t["total_ms"]
    major, minor = torch.cuda.get_device_capability()
    assert r["device_arch"] == major * 10 + minor
    assert "bfloat16 8192^3" in r["throughput_convention"]["ceiling"]["label"]
    assert r["throughput_unprofiled"]["mfu_measured"] > 0


def test_scaling_probe_on_cuda(compose, tmp_path):
    from align.probes import scaling

    cfg = to_typed(compose(["probe=scaling", "probe.scaling.lengths=[128,256,512,1024]",
                            "probe.scaling.measure_steps=2", *SMALL], config_name="probe"))
    assert scaling.run(cfg, tmp_path) == 0
    r = json.loads((tmp_path / "scaling.json").read_text())
    assert r["model"]["autocast_dtype"] == "bfloat16"
    assert all(0 < p["ce_forward_fraction"] < 1 for p in r["points"])
    assert (tmp_path / "scaling.png").stat().st_size > 0
