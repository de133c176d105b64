"""A collective that one rank never joins fails after `parallel.pg_timeout_s` instead of hanging the
job, and the flight-recorder variables were set from config before the process group existed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.integration.distributed import run

TIMEOUT_S = 3


def _one_rank_never_joins(rank: int, world: int, tmp: str) -> int:
    import torch
    import torch.distributed as dist

    from align.config import Device, ParallelConfig, ParallelKind
    from align.parallel.env import init_distributed

    init_distributed(ParallelConfig(kind=ParallelKind.fsdp, pg_timeout_s=TIMEOUT_S, flight_recorder_entries=123),
                     Device.cpu, Path(tmp))
    done = Path(tmp) / "rank0.json"
    if rank == 1:  # stays out of the collective until rank 0 has given up on it
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        return 0
    t0 = time.monotonic()
    out = {"env": {k: os.environ.get(k)
                   for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE")}}
    try:
        dist.all_reduce(torch.ones(1))
        out["raised"] = None
    except Exception as e:  # the timeout surfaces as an error on the waiting rank
        out["raised"] = f"{type(e).__name__}: {str(e)[:300]}"
    out["after_s"] = time.monotonic() - t0
    done.write_text(json.dumps(out))
    return 0


def test_a_missing_rank_becomes_an_error_after_the_configured_timeout(tmp_path):
    assert run(_one_rank_never_joins, 2, str(tmp_path), timeout=120) == [0, 0]
    out = json.loads((tmp_path / "rank0.json").read_text())
    assert out["raised"] and "timed out" in out["raised"].lower(), out
    assert TIMEOUT_S - 0.5 < out["after_s"] < TIMEOUT_S + 20, out
    assert out["env"]["TORCH_FR_BUFFER_SIZE"] == "123" and out["env"]["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert out["env"]["TORCH_FR_DUMP_TEMP_FILE"].startswith(str((tmp_path / "rank0" / "flight_recorder").resolve()))
