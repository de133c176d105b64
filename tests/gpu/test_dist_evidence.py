"""GPU evidence for issue 5, asserted: scripts/dist_evidence.py on the GPU machine (2 GPUs when
present). fp32 parity of fsdp (and ep with 2 GPUs) against one process, and a SIGTERM to the last rank
under the supervisor: stop checkpoint, relaunch, resume, one history row per step."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

torch = pytest.importorskip("torch")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dist_evidence_on_gpu(tmp_path):
    out = tmp_path / "out"
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)  # keep the carried wheels
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "dist_evidence.py")], cwd=REPO, timeout=1800,
                       env={**os.environ, "OUT": str(out), "PYTHONPATH": path}, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((out / "dist_evidence" / "dist_evidence.json").read_text())
    runs = r["runs"]
    assert runs["single"]["exit"] == 0 and len(runs["single"]["losses"]) == 5, (
        (out / "dist_evidence" / "single.log").read_text()[-3000:])  # the reference every layout is held to
    for k in ("fsdp", "ep") if r["ranks"] >= 2 else ("fsdp",):
        log = out / "dist_evidence" / f"{k}.log"
        assert runs[k]["exit"] == 0 and runs[k]["vs_single"]["steps"] == 5, log.read_text()[-3000:]
        assert runs[k]["vs_single"]["max_abs_loss_diff"] < 1e-3, runs[k]
    s = runs["supervised"]
    assert s["exit"] == 0 and s["signal"] is not None
    assert [a["code"] for a in s["attempts"]] == [143, 0] and s["attempts"][0]["progressed"]
    assert s["history_steps"] == list(range(1, 13))
    assert s["vs_uninterrupted"]["steps"] == 12
