"""Optimizers and schedules. Kwargs are built as dicts (checked by name in preflight), then called."""

from __future__ import annotations

from typing import Any, Callable

import torch

from align.config import OptimizerConfig, OptimizerName


def optimizer_class(cfg: OptimizerConfig, sharded: bool = False) -> Callable[..., torch.optim.Optimizer]:
    """`sharded`: the parameters are DTensors (parallel=fsdp/ep). bitsandbytes' AdamW8bit fails there
    ("mixed torch.Tensor and DTensor"); torchao's works with FSDP2 and DCP (LANDMINES 17)."""
    if cfg.name == OptimizerName.adamw8bit:
        if sharded:
            from torchao.optim import AdamW8bit

            return AdamW8bit
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit
    return torch.optim.AdamW


def optimizer_impl(opt: torch.optim.Optimizer) -> str:
    """The class that actually runs, for the manifest: e.g. torchao.optim.adam.AdamW8bit."""
    return f"{type(opt).__module__}.{type(opt).__qualname__}"


def optimizer_kwargs(cfg: OptimizerConfig, device: torch.device) -> dict[str, Any]:
    kw: dict[str, Any] = {"lr": cfg.lr, "betas": tuple(cfg.betas), "eps": cfg.eps, "weight_decay": cfg.weight_decay}
    if cfg.name == OptimizerName.adamw and device.type == "cuda":
        kw["fused"] = True
    return kw


def scheduler_kwargs(cfg: OptimizerConfig, max_steps: int) -> dict[str, Any]:
    # warmup_ratio stays in config (it survives a change of run length); steps at the call site.
    return {"num_warmup_steps": int(round(cfg.warmup_ratio * max_steps)), "num_training_steps": max_steps}


def build_optimizer(cfg: OptimizerConfig, params, device: torch.device) -> torch.optim.Optimizer:
    from torch.distributed.tensor import DTensor

    params = list(params)
    sharded = any(isinstance(p, DTensor) for p in params)
    return optimizer_class(cfg, sharded)(params, **optimizer_kwargs(cfg, device))


def scheduler_factory():
    from transformers import get_cosine_schedule_with_warmup

    return get_cosine_schedule_with_warmup


def build_scheduler(cfg: OptimizerConfig, optimizer: torch.optim.Optimizer, max_steps: int):
    return scheduler_factory()(optimizer, **scheduler_kwargs(cfg, max_steps))
