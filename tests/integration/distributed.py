"""Helpers for multi-rank tests on a CPU gloo mesh: spawn N ranks that each build and fit a Trainer
(in-process, no `python -m` startup), with a hard timeout that FAILS the test on a hang."""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import torch.multiprocessing as mp

# Small enough for 2 shared CPU cores, big enough that every rank sees padding and several windows.
TINY = [
    "logger=none", "trainer.device=cpu", "trainer.export=false", "trainer.log_every=1000",
    "data.max_records=96", "data.max_seq_len=64", "data.truncation=truncate",
    "sampler=shuffle", "sampler.micro_batch_size=2", "optimizer.warmup_ratio=0", "optimizer.lr=3e-3",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn: Callable, rank: int, world: int, port: int, env: dict, args: tuple) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "OMP_NUM_THREADS": "1", **env})
    import torch

    torch.set_num_threads(1)
    try:
        code = fn(rank, world, *args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    os._exit(int(code or 0))


def start(fn: Callable, world: int, *args: Any, env: dict | None = None) -> list:
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, env or {}, args), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    return procs


def wait(procs: Sequence, timeout: float, what: str = "ranks") -> list[int]:
    """Exit codes; a rank still alive at the deadline is killed and the test fails as a hang."""
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    alive = [i for i, p in enumerate(procs) if p.is_alive()]
    if alive:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)
        import pytest

        pytest.fail(f"HANG: {what}: ranks {alive} still running after {timeout:.0f}s (killed)")
    return [p.exitcode for p in procs]


def run(fn: Callable, world: int, *args: Any, timeout: float = 240, env: dict | None = None) -> list[int]:
    return wait(start(fn, world, *args, env=env), timeout)


# ------------------------------------------------------------------------- worker functions


def fit(rank: int, world: int, run_dir: str, overrides: list[str], hook: Callable | None = None) -> int:
    """Build and fit one Trainer; return the CLI's exit code for it. Writes this rank's outcome and
    the trainer's model_info to <run_dir>/rank<r>/result.json. `hook(trainer, rank)` runs after build."""
    from align.config import to_typed
    from align.errors import AlignError
    from align.run.cli import compose
    from align.trainer import Trainer

    out = Path(run_dir) / f"rank{rank}"
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"rank": rank}
    try:
        trainer = Trainer.build(to_typed(compose(overrides)), Path(run_dir))
        result["model_info"] = trainer.model_info
        if hook is not None:
            hook(trainer, rank)
        result["code"] = trainer.fit()
    except AlignError as e:
        result.update(code=e.exit_code, error=str(e))
    (out / "result.json").write_text(json.dumps(result, default=str))
    return result["code"]


def fit_many(rank: int, world: int, jobs: list[dict], out: str) -> int:
    """Several runs in the same processes (one process group, imports paid once). Each job is a dict
    with run_dir, overrides and optionally env (set for that job) and hook. Exit codes go to `out`."""
    codes = []
    for job in jobs:
        saved = {k: os.environ.get(k) for k in job.get("env", {})}
        os.environ.update(job.get("env", {}))
        try:
            codes.append(fit(rank, world, job["run_dir"], job["overrides"], job.get("hook")))
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        if job.get("after") is not None:
            job["after"](rank, world)
    if rank == 0:
        Path(out).write_text(json.dumps(codes))
    return 0


def result(run_dir: str | Path, rank: int) -> dict:
    return json.loads((Path(run_dir) / f"rank{rank}" / "result.json").read_text())


def history(run_dir: str | Path) -> list[dict]:
    p = Path(run_dir) / "history.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
