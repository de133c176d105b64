"""Who am I in the job: rank, world size and device, from torchrun's environment."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from align.config import Device


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(choice: Device, local_rank: int = 0) -> torch.device:
    if choice == Device.cuda or (choice == Device.auto and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def dist_env(device: Device) -> DistEnv:
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    return DistEnv(rank=rank, world=world, local_rank=local, device=resolve_device(device, local))
