"""`parallelize()`: activation checkpointing, then the sharding that `parallel.kind` names."""

from __future__ import annotations

from typing import Any

import torch

from align.config import ParallelConfig, ParallelKind
from align.parallel.env import DistEnv


def activation_checkpointing_call(model_cls: type) -> tuple[str, dict[str, Any]]:
    """The method and kwargs that turn on activation checkpointing: transformers 5.24 renamed
    gradient_checkpointing_enable (LANDMINES 6); use what is installed. Preflight checks the same pair."""
    if hasattr(model_cls, "activation_checkpointing_enable"):
        return "activation_checkpointing_enable", {"activation_checkpointing_kwargs": {"use_reentrant": False}}
    return "gradient_checkpointing_enable", {"gradient_checkpointing_kwargs": {"use_reentrant": False}}


def enable_activation_checkpointing(model: torch.nn.Module) -> str:
    method, kwargs = activation_checkpointing_call(type(model))
    getattr(model, method)(**kwargs)
    return method


def parallelize(model: torch.nn.Module, cfg: ParallelConfig, env: DistEnv) -> dict[str, Any]:
    """Shard `model` in place (it is already on `env.device`); returns what was applied, for the
    manifest, including `grad_scale`: the factor that undoes FSDP2's averaging of gradients over ranks."""
    info: dict[str, Any] = {"kind": cfg.kind.value, "world_size": env.world, "grad_scale": 1,
                            "activation_checkpointing": None}
    if cfg.activation_checkpointing:
        info["activation_checkpointing"] = enable_activation_checkpointing(model)
    if cfg.kind == ParallelKind.fsdp:
        from align.parallel.fsdp import apply_fsdp

        info.update(apply_fsdp(model, cfg, env.device, env.world), grad_scale=env.world)
    elif cfg.kind == ParallelKind.ep:
        from align.parallel.ep import apply_ep

        info.update(apply_ep(model, cfg, env.device, env.world), grad_scale=env.world)
    return info
