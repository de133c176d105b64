"""Who am I in the job (rank, world size, device: torchrun's or submitit's environment), and the one
process group of the job, created with a timeout and the flight recorder set from config."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist

from align.config import Device, ParallelConfig, ParallelKind, Precision
from align.errors import ConfigError


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over ranks, in place (a no-op in one process)."""
        if self.distributed:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        """The elementwise max of `t` over ranks, in place (a no-op in one process)."""
        if self.distributed:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def rank_dir(self, run_dir: Path) -> Path:
        """Where this rank's own files go: <run_dir>/rank<r>/."""
        d = Path(run_dir) / f"rank{self.rank}"
        d.mkdir(parents=True, exist_ok=True)
        return d


def resolve_device(choice: Device, local_rank: int = 0) -> torch.device:
    if choice == Device.cuda or (choice == Device.auto and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def export_submitit_env() -> None:
    """Under hydra-submitit-launcher every Slurm task runs the job function with no RANK/WORLD_SIZE:
    export them (and MASTER_ADDR/PORT) from submitit's job environment, as torchrun would."""
    if "RANK" in os.environ or os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return
    from submitit.helpers import TorchDistributedEnvironment

    TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)


def dist_env(device: Device) -> DistEnv:
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    return DistEnv(rank=rank, world=world, local_rank=local, device=resolve_device(device, local))


def job_device(choice: Device) -> torch.device:
    """The device this process of the job trains on, as `init_distributed` will resolve it (torchrun's or
    submitit's local rank), known before it runs: the one the job's plan is made for (align/plan/planner.py)."""
    export_submitit_env()
    return dist_env(choice).device


def hang_diagnostics_env(cfg: ParallelConfig, run_dir: Path, rank: int) -> dict[str, str]:
    """Flight-recorder variables, read by NCCL when the process group is created (docs/pitfalls.md#17:
    TORCH_FR_* replaced TORCH_NCCL_TRACE_*). Values the user already exported win."""
    if cfg.flight_recorder_entries <= 0:
        return {}
    dump = Path(run_dir).resolve() / f"rank{rank}" / "flight_recorder"
    return {
        "TORCH_FR_BUFFER_SIZE": str(cfg.flight_recorder_entries),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": str(dump / "trace_rank_"),  # torch appends the rank
    }


def init_distributed(cfg: ParallelConfig, device: Device, run_dir: Path) -> DistEnv:
    """The job's process group (once per process; a sweep inside one process reuses it)."""
    export_submitit_env()
    env = dist_env(device)
    if cfg.kind == ParallelKind.single:
        if env.world > 1:
            raise ConfigError("parallel.kind", f"single trains one replica per process, and this job has {env.world} "
                              "ranks: every rank would train alone on its own rows; use parallel=fsdp (or ep)",
                              "single")
        return env
    if env.device.type == "cuda":
        torch.cuda.set_device(env.device)
    if dist.is_initialized():
        return env
    for k, v in hang_diagnostics_env(cfg, run_dir, env.rank).items():
        os.environ.setdefault(k, v)
        if k == "TORCH_FR_DUMP_TEMP_FILE":
            Path(os.environ[k]).parent.mkdir(parents=True, exist_ok=True)
    kw: dict = {"backend": "cpu:gloo,cuda:nccl" if env.device.type == "cuda" else "gloo",
                "timeout": timedelta(seconds=cfg.pg_timeout_s)}
    if env.device.type == "cuda":
        kw["device_id"] = env.device
    if "MASTER_ADDR" not in os.environ and env.world == 1:
        # `python -m align.train parallel=fsdp` without a launcher: a one-rank group needs no rendezvous.
        kw.update(store=dist.HashStore(), rank=0, world_size=1)
    dist.init_process_group(**kw)
    atexit.register(_destroy)
    return env


def _destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def autocast_dtype(precision: Precision, device_type: str) -> Optional[torch.dtype]:
    """The dtype the trainer's forward autocasts to: bf16 under precision=bf16, or auto on CUDA;
    None (no autocast: the parameters' dtype) otherwise. The trainer and the objectives' gates share it."""
    bf16 = precision == Precision.bf16 or (precision == Precision.auto and device_type == "cuda")
    return torch.bfloat16 if bf16 else None


def autocast_context(precision: Precision, device_type: str) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of the trainer's forward autocast (`autocast_dtype`; a null context where there is none):
    the trainer, the mask gate and GRPO's generation enter the same one."""
    dtype = autocast_dtype(precision, device_type)
    if dtype is None:
        return contextlib.nullcontext
    return functools.partial(torch.autocast, device_type, dtype=dtype)
