"""Expert parallel through transformers' own implementation (DistributedConfig EP, 5.24).

Experts are sharded on dim 0 over an `ep` mesh dimension and reached by `AllToAllEP` (token
exchange with torch's autograd all-to-all); the dense parameters are FSDP2-sharded over all ranks by
transformers' FSDP plan. Measured on a 2-rank gloo mesh: losses and gradients equal a single process
to fp32 rounding (tests/integration/test_parallel_parity.py).

Only the plan's EXPERT rules are applied: Gemma-4's `base_model_ep_plan` also carries tensor-parallel
rules for its dense MLP, which would shard those layers over the EP ranks as if they shared one
batch; under data parallel they do not (transformers then fails with overlapping meshes).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from align.config import ParallelConfig
from align.errors import ConfigError
from align.parallel.fsdp import param_dtype

EP_STYLES = frozenset({"grouped_gemm", "ep_dispatch_experts"})
"""transformers' expert-parallel styles (the rest of an ep_plan is tensor parallel)."""


def _matches(rule: str, names: set[str]) -> bool:
    pattern = re.compile(re.escape(rule).replace(r"\*", r"\d+"))
    return any(pattern.fullmatch(n) for n in names)


def expert_plan(model: torch.nn.Module) -> dict[str, str]:
    """The rules of the model's EP plan that shard or dispatch experts AND name something in it."""
    names = {n for n, _ in model.named_modules()} | {n for n, _ in model.named_parameters()}
    plan = dict(getattr(model, "ep_plan", None) or {})
    return {k: v for k, v in plan.items() if v in EP_STYLES and _matches(k, names)}


def ep_size(cfg: ParallelConfig, world: int) -> int:
    size = cfg.ep_size or world
    if world % size:
        raise ConfigError("parallel.ep_size", f"must divide the world size {world}", size)
    return size


def distributed_config_kwargs(cfg: ParallelConfig, device: torch.device, world: int) -> dict[str, Any]:
    """Kwargs of transformers' DistributedConfig, built as data so their names are checked first."""
    return {"fsdp_size": world, "ep_size": ep_size(cfg, world), "ep_implementation": "all_to_all",
            "fsdp_mixed_precision": param_dtype(cfg, device) == torch.bfloat16}


def apply_ep(model: torch.nn.Module, cfg: ParallelConfig, device: torch.device, world: int) -> dict[str, Any]:
    from transformers.distributed import DistributedConfig
    from transformers.distributed.utils import initialize_distributed_mesh

    from align.core.signatures import check_kwargs

    plan = expert_plan(model)
    if "ep_dispatch_experts" not in plan.values():
        raise ConfigError("parallel.kind", f"ep shards MoE experts, and {type(model).__name__} has none "
                          "(choose an MoE family, or parallel=fsdp)", "ep")
    kw = distributed_config_kwargs(cfg, device, world)
    check_kwargs(DistributedConfig, kw, "parallel")
    dc = DistributedConfig(**kw)
    n_experts = {p.shape[0] for n, p in model.named_parameters()
                 if n.endswith(("gate_up_proj", "down_proj")) and p.dim() == 3}
    if any(e % dc.ep_size for e in n_experts):
        raise ConfigError("parallel.ep_size", f"must divide the number of experts {sorted(n_experts)}", dc.ep_size)
    model.ep_plan = plan
    _, meshes = initialize_distributed_mesh(dc)
    type(model).maybe_distribute_model(model, dc, meshes)
    return {"ep_size": dc.ep_size, "efsdp_size": dc.efsdp_size, "ep_implementation": dc.ep_implementation,
            "ep_plan": plan, "fsdp_param_dtype": str(param_dtype(cfg, device)).removeprefix("torch."),
            "fsdp_reduce_dtype": "float32"}
