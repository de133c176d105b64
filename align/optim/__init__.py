"""Optimizers and schedules. Kwargs are built as dicts (checked by name in preflight), then called."""

from __future__ import annotations

import functools
import importlib.util
import math
from typing import TYPE_CHECKING, Any, Callable

from align.config import OptimizerConfig, OptimizerName
from align.config.trainer_config import Schedule

if TYPE_CHECKING:  # torch is imported by the calls, not by preflight's kwargs builders
    import torch

SCHEDULERS = {Schedule.cosine: "align.optim:cosine_with_warmup", Schedule.linear: "align.optim:linear_with_warmup",
              Schedule.constant: "align.optim:constant_with_warmup"}
"""The LR schedule factory of each `optimizer.schedule` (import paths: preflight reads their
signatures without importing them)."""


def scheduler_target(cfg: OptimizerConfig) -> str:
    return SCHEDULERS[cfg.schedule]


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
    from align.core.signatures import resolve

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
    kw = {"num_warmup_steps": int(round(cfg.warmup_ratio * max_steps)), "num_training_steps": max_steps}
    if cfg.schedule == Schedule.constant:  # it has no end: transformers' signature takes no length
        del kw["num_training_steps"]
    return kw


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


def _linear_factor(step: int, *, num_warmup_steps: int, num_training_steps: int) -> float:
    if step < num_warmup_steps:
        return float(step) / float(max(1, num_warmup_steps))
    return max(0.0, float(num_training_steps - step) / float(max(1, num_training_steps - num_warmup_steps)))


def linear_with_warmup(optimizer: torch.optim.Optimizer, num_warmup_steps: int, num_training_steps: int,
                       last_epoch: int = -1):
    """transformers' `get_linear_schedule_with_warmup`, written here for the reason `cosine_with_warmup`
    is; tests/unit/optim/test_schedule.py holds the two equal."""
    from torch.optim.lr_scheduler import LambdaLR

    factor = functools.partial(_linear_factor, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps)
    return LambdaLR(optimizer, factor, last_epoch)


def _constant_factor(step: int, *, num_warmup_steps: int) -> float:
    if step < num_warmup_steps:
        return float(step) / float(max(1.0, num_warmup_steps))
    return 1.0


def constant_with_warmup(optimizer: torch.optim.Optimizer, num_warmup_steps: int, last_epoch: int = -1):
    """transformers' `get_constant_schedule_with_warmup`, written here for the reason `cosine_with_warmup`
    is; tests/unit/optim/test_schedule.py holds the two equal."""
    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, functools.partial(_constant_factor, num_warmup_steps=num_warmup_steps), last_epoch)


def scheduler_factory(cfg: OptimizerConfig):
    from align.core.signatures import resolve

    return resolve(scheduler_target(cfg))


def build_scheduler(cfg: OptimizerConfig, optimizer: torch.optim.Optimizer, max_steps: int):
    return scheduler_factory(cfg)(optimizer, **scheduler_kwargs(cfg, max_steps))
