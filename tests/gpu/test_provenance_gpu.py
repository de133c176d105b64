"""Provenance on a CUDA device (GPU machine: `pytest -m gpu tests/gpu/test_provenance_gpu.py`).

What can only be told on a GPU: the device's name and capability, the autocast dtype, and the SDPA
kernel family from profiler kernel names (docs/triage.md#5). Writes each manifest and mask report to
$OUT/provenance_gpu/ (default ./outputs/gpu) for the record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from align.config import to_typed
from align.run.cli import compose

pytestmark = pytest.mark.gpu
OUT = Path(os.environ.get("OUT", "outputs/gpu")) / "provenance_gpu"
SMALL = ["data.max_records=64", "logger=none", "allow_dirty=true", "trainer.device=cuda", "trainer.max_steps=3",
         "trainer.export=false"]


@pytest.fixture(autouse=True)
def _needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def _run(tmp_path: Path, *overrides: str) -> dict:
    from omegaconf import OmegaConf

    from align.run.manifest import key_paths, load, manifest_paths, null_leaves
    from align.run.preflight_checks import collect
    from align.run.record import RunRecord
    from align.trainer import Trainer

    cfg = compose([*SMALL, *overrides])
    typed = to_typed(cfg)
    run_dir = tmp_path / "run"
    record = RunRecord(typed, OmegaConf.to_container(cfg, resolve=True), run_dir, list(overrides), list(overrides))
    with record:
        record.start(collect(typed))
        trainer = Trainer.build(typed, run_dir, record.wandb_config, None)
        record.built(trainer)
        record.finished(trainer, trainer.fit())
    m = load(run_dir)
    assert set(manifest_paths(m)) == set(key_paths())
    assert all(p in m["null_reasons"] for p in null_leaves(m))
    OUT.mkdir(parents=True, exist_ok=True)
    name = "_".join(o.replace("=", "-").replace("/", "-") for o in overrides) or "default"
    (OUT / f"provenance_{name}.json").write_text(json.dumps(m, indent=2) + "\n")
    return m


@pytest.mark.parametrize("overrides", [(), ("model=gemma4",), ("model=olmoe",)])
def test_gpu_manifest_records_device_and_sdpa_kernel_family(tmp_path, overrides):
    m = _run(tmp_path, *overrides)
    assert m["run"]["exit_code"] == 0
    assert m["device"]["type"] == "cuda" and m["device"]["name"] == torch.cuda.get_device_name()
    assert m["device"]["capability"] == list(torch.cuda.get_device_capability())
    assert m["versions"]["cuda"] == torch.version.cuda
    assert m["model"]["autocast_dtype"] == "bfloat16"
    # the family's own choice under attention auto (align/config/model.py AUTO_ATTENTION): layered for Gemma-4
    assert m["model"]["attn_implementation_resolved"] == ("align_layered" if overrides == ("model=gemma4",) else "sdpa")
    if overrides == ("model=gemma4",):  # layered attention: no SDPA kernel family to read, and the manifest says why
        assert m["model"]["sdpa_kernel_family"] is None
        assert "align_layered" in m["null_reasons"]["model.sdpa_kernel_family"]
    else:
        assert m["model"]["sdpa_kernel_family"] in ("flash", "efficient", "cudnn", "math"), m["null_reasons"]
        if m["model"]["sdpa_kernel_family"] != "math":
            assert m["model"]["sdpa_kernels"]
    assert m["mask_probe"]["ok"]
    # the default (auto) on CUDA: compiled blocks for the families run compiled on the GPU, the compiled step
    compiled = overrides != ("model=gemma4",)
    assert m["compile"]["trainer"]["resolved"] is compiled and m["compile"]["optimizer"]["resolved"] is True
    assert m["compile"]["inductor_cache"]["dir"] and m["throughput"]["throughput/first_step_s"] > 0


def test_gpu_mask_probe_gemma4_bf16(tmp_path):
    from align.probes import mask

    cfg = to_typed(compose(["probe=mask", "model=gemma4", "model.dtype=bfloat16", "trainer.device=cuda"],
                           config_name="probe"))
    assert mask.run(cfg, tmp_path) == 0
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "mask_gemma4.json").write_text((tmp_path / "mask.json").read_text())
