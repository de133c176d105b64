"""`parallelize()`: activation checkpointing, then the sharding that `parallel.kind` names."""

from __future__ import annotations

import math
from typing import Any

import torch

from align.config import ParallelConfig, ParallelKind
from align.errors import ConfigError
from align.parallel.env import DistEnv


def activation_checkpointing_call(model_cls: type) -> tuple[str, dict[str, Any]]:
    """The method and kwargs that turn on activation checkpointing: transformers 5.24 renamed
    gradient_checkpointing_enable (docs/pitfalls.md#6); use what is installed. Preflight checks the same pair."""
    if hasattr(model_cls, "activation_checkpointing_enable"):
        return "activation_checkpointing_enable", {"activation_checkpointing_kwargs": {"use_reentrant": False}}
    return "gradient_checkpointing_enable", {"gradient_checkpointing_kwargs": {"use_reentrant": False}}


def enable_activation_checkpointing(model: torch.nn.Module) -> str:
    method, kwargs = activation_checkpointing_call(type(model))
    getattr(model, method)(**kwargs)
    return method


def checkpointed_indices(n_blocks: int, fraction: float) -> list[int]:
    """The blocks to recompute, of `n_blocks`: k = max(1, floor(f*n + 0.5)) spread evenly over depth
    (floor(i*n/k) for i < k), so the memory kept and the recompute paid are spread too."""
    k = min(n_blocks, max(1, math.floor(fraction * n_blocks + 0.5)))
    return [i * n_blocks // k for i in range(k)]


def checkpointing_plan(model: torch.nn.Module, fraction: float) -> list[int]:
    """`checkpointed_indices` over this model's decoder blocks. A fraction < 1 needs transformers'
    per-block switch (GradientCheckpointingLayer.gradient_checkpointing); a model without it would
    recompute every block, so it is refused. Preflight runs this on the meta model, build on the real one."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    from align.parallel.fsdp import decoder_blocks

    blocks = decoder_blocks(model)
    if fraction < 1:
        other = sorted({type(b).__name__ for b in blocks if not isinstance(b, GradientCheckpointingLayer)})
        if other:
            raise ConfigError("parallel.activation_checkpointing_fraction",
                              f"a fraction < 1 needs decoder blocks that are transformers GradientCheckpointingLayers, "
                              f"and {type(model).__name__}'s {other} are not; use 1.0", fraction)
    return checkpointed_indices(len(blocks), fraction)


def apply_activation_checkpointing(model: torch.nn.Module, fraction: float) -> dict[str, Any]:
    """Turn on transformers' activation checkpointing, then off again on the blocks outside the
    plan. Returns what the blocks now say (read back, not the plan), for the manifest."""
    from align.parallel.fsdp import decoder_blocks

    plan = checkpointing_plan(model, fraction)
    method = enable_activation_checkpointing(model)
    blocks = decoder_blocks(model)
    for i, block in enumerate(blocks):
        if i not in plan:
            block.gradient_checkpointing = False
    flags = [getattr(b, "gradient_checkpointing", None) for b in blocks]
    # Blocks without the per-block flag (fraction 1 only) are checkpointed by the model's own loop.
    on = None if None in flags else [i for i, f in enumerate(flags) if f]
    return {"activation_checkpointing": method, "activation_checkpointing_fraction": fraction,
            "activation_checkpointing_blocks": on,
            "activation_checkpointing_block_count": None if on is None else len(on),
            "decoder_blocks": len(blocks)}


def parallelize(model: torch.nn.Module, cfg: ParallelConfig, env: DistEnv) -> dict[str, Any]:
    """Shard `model` in place (it is already on `env.device`); returns what was applied, for the
    manifest, including `grad_scale`: the factor that undoes FSDP2's averaging of gradients over ranks."""
    info: dict[str, Any] = {"kind": cfg.kind.value, "world_size": env.world, "grad_scale": 1,
                            "activation_checkpointing": None, "activation_checkpointing_blocks": []}
    if cfg.activation_checkpointing:
        info.update(apply_activation_checkpointing(model, cfg.activation_checkpointing_fraction))
    if cfg.kind == ParallelKind.fsdp:
        from align.parallel.fsdp import apply_fsdp

        info.update(apply_fsdp(model, cfg, env.device, env.world), grad_scale=env.world)
    elif cfg.kind == ParallelKind.ep:
        from align.parallel.ep import apply_ep

        info.update(apply_ep(model, cfg, env.device, env.world), grad_scale=env.world)
    return info
