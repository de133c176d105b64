"""FSDP2: `fully_shard` each decoder block, then the root, over a 1-D DeviceMesh of all ranks.

Parameters are gathered in `param_dtype` for compute (bf16 on CUDA by default) and gradients are
reduce-scattered in fp32 (MixedPrecisionPolicy). FSDP2 AVERAGES gradients over ranks: the trainer
multiplies its per-token loss by the world size to turn that average back into a sum (see
`grad_scale`), so the loss is averaged per loss token over the whole window on every rank.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from align.config import ParallelConfig, ParamDtype


def param_dtype(cfg: ParallelConfig, device: torch.device) -> torch.dtype:
    if cfg.param_dtype == ParamDtype.auto:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, cfg.param_dtype.value)


def mp_policy_kwargs(cfg: ParallelConfig, device: torch.device) -> dict[str, Any]:
    """MixedPrecisionPolicy kwargs, built as data so their names can be checked."""
    return {"param_dtype": param_dtype(cfg, device), "reduce_dtype": torch.float32}


def decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks, named by transformers' own `_no_split_modules` (no family branches)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"{type(model).__name__} declares no _no_split_modules; cannot find its decoder blocks")
    return blocks


def dp_mesh(device: torch.device, world: int) -> DeviceMesh:
    return init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))


def apply_fsdp(model: torch.nn.Module, cfg: ParallelConfig, device: torch.device, world: int) -> dict[str, Any]:
    mesh = dp_mesh(device, world)
    mp = MixedPrecisionPolicy(**mp_policy_kwargs(cfg, device))
    blocks = decoder_blocks(model)
    block_class = type(blocks[0]).__name__  # fully_shard swaps the class for an FSDP<Name> subclass
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=cfg.reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return {"fsdp_blocks": len(blocks), "fsdp_block_class": block_class,
            "fsdp_param_dtype": str(mp.param_dtype).removeprefix("torch."), "fsdp_reduce_dtype": "float32"}
