"""Optimizers and schedules. Kwargs are built as dicts (checked by name in preflight), then called."""

from __future__ import annotations

import functools
import importlib.util
import math
from typing import TYPE_CHECKING, Any, Callable

from align.config import OptimizerConfig, OptimizerName

if TYPE_CHECKING:  # torch is imported by the calls, not by preflight's kwargs builders
    import torch

SCHEDULER = "align.optim:cosine_with_warmup"
"""The LR schedule factory (an import path: preflight reads its signature without importing it)."""


def optimizer_target(cfg: OptimizerConfig, sharded: bool = False) -> str:
    """Import path of the optimizer class. `sharded`: the parameters are DTensors (parallel=fsdp/ep).
    bitsandbytes' AdamW8bit fails there ("mixed torch.Tensor and DTensor"); torchao's works with FSDP2
    and DCP (docs/pitfalls.md#12). On plain tensors bitsandbytes when installed, else torchao (the GPU
    image of 2026-11-30 has no bitsandbytes); the class that ran is recorded as `optimizer_impl`."""
    if cfg.name == OptimizerName.adamw8bit:
        if sharded or importlib.util.find_spec("bitsandbytes") is None:
            return "torchao.optim:AdamW8bit"
        return "bitsandbytes.optim:AdamW8bit"
    return "torch.optim:AdamW"


def optimizer_class(cfg: OptimizerConfig, sharded: bool = False) -> Callable[..., torch.optim.Optimizer]:
    from align.run.signatures import resolve

    return resolve(optimizer_target(cfg, sharded))


def optimizer_impl(opt: torch.optim.Optimizer) -> str:
    """The class that actually runs, for the manifest: e.g. torchao.optim.adam.AdamW8bit."""
    return f"{type(opt).__module__}.{type(opt).__qualname__}"


def optimizer_kwargs(cfg: OptimizerConfig, device_type: str) -> dict[str, Any]:
    kw: dict[str, Any] = {"lr": cfg.lr, "betas": tuple(cfg.betas), "eps": cfg.eps, "weight_decay": cfg.weight_decay}
    if cfg.name == OptimizerName.adamw and device_type == "cuda":
        # optimizer.compile: torch.compile steps the foreach implementation (align.optim.step.CompiledStep);
        # capturable keeps its step counts on the device, which a tensor learning rate needs
        kw.update({"foreach": True, "capturable": True} if cfg.compile is True else {"fused": True})
    return kw


def scheduler_kwargs(cfg: OptimizerConfig, max_steps: int) -> dict[str, Any]:
    # warmup_ratio stays in config (it survives a change of run length); steps at the call site.
    return {"num_warmup_steps": int(round(cfg.warmup_ratio * max_steps)), "num_training_steps": max_steps}


def build_optimizer(cfg: OptimizerConfig, params, device: torch.device) -> torch.optim.Optimizer:
    from torch.distributed.tensor import DTensor

    params = list(params)
    sharded = any(isinstance(p, DTensor) for p in params)
    return optimizer_class(cfg, sharded)(params, **optimizer_kwargs(cfg, device.type))


def _cosine_factor(step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float) -> float:
    if step < num_warmup_steps:
        return float(step) / float(max(1, num_warmup_steps))
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))


def cosine_with_warmup(optimizer: torch.optim.Optimizer, num_warmup_steps: int, num_training_steps: int,
                       num_cycles: float = 0.5, last_epoch: int = -1):
    """transformers' `get_cosine_schedule_with_warmup` (same signature, same factor at every step, a
    partial on torch's LambdaLR as there), written here because its module imports transformers'
    Trainer utilities, and they import peft and bitsandbytes whenever installed: every run would
    import both for one formula (docs/pitfalls.md#25). tests/unit/optim/test_schedule.py holds the
    two equal."""
    from torch.optim.lr_scheduler import LambdaLR

    factor = functools.partial(_cosine_factor, num_warmup_steps=num_warmup_steps,
                               num_training_steps=num_training_steps, num_cycles=num_cycles)
    return LambdaLR(optimizer, factor, last_epoch)


def scheduler_factory():
    from align.run.signatures import resolve

    return resolve(SCHEDULER)


def build_scheduler(cfg: OptimizerConfig, optimizer: torch.optim.Optimizer, max_steps: int):
    return scheduler_factory()(optimizer, **scheduler_kwargs(cfg, max_steps))
