"""The global gradient norm and clipping over parameters that may be DTensors on different meshes
(FSDP shards of dense weights on one mesh, expert shards on another under parallel=ep).

`torch.nn.utils.clip_grad_norm_` stacks all norms together and fails on mixed meshes, so norms are
taken per mesh (each a full reduction over that mesh), combined, and every rank scales its local
shards by the same coefficient.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable, Iterable

import torch
from torch.distributed.tensor import DTensor


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def fused_adam(optimizer) -> bool:
    """torch's fused Adam/AdamW: its one kernel divides every gradient by `optimizer.grad_scale` (the
    hook GradScaler uses to unscale)."""
    return (isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW) and bool(optimizer.defaults.get("fused"))
            and getattr(optimizer, "_step_supports_amp_scaling", False))


def folds_clipping(optimizer) -> bool:
    """The optimizer's step applies `optimizer.grad_scale` itself: fused Adam(W), or a step compiled by
    align (`align_folds_clip`, set by align.optim.step.CompiledStep). Clipping through it saves a
    read and a write of every gradient per step. Plain tensors only: DTensor shards keep the explicit scale."""
    return fused_adam(optimizer) or bool(getattr(optimizer, "align_folds_clip", False))


def foreach_norms(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per-tensor fp64 L2 norms of plain tensors, one fused foreach launch."""
    return list(torch._foreach_norm(grads, 2.0, dtype=torch.float64))


def clip_grad_norm_(params: Iterable[torch.nn.Parameter], max_norm: float, optimizer=None,
                    norms_of: Callable[[list[torch.Tensor]], list[torch.Tensor]] = foreach_norms) -> float:
    """Clip to `max_norm` (<= 0: do not clip) and return the pre-clip global L2 norm (maybe nan/inf).
    With an `optimizer` that `folds_clipping`, plain-tensor gradients are left as they are and the
    optimizer's next step divides them by 1/coefficient instead (set here, or cleared). `norms_of`
    takes the per-tensor norms of plain tensors (align.optim.step.CompiledStep passes a compiled one)."""
    groups: dict = defaultdict(list)
    for p in params:
        if p.grad is not None:
            groups[p.grad.device_mesh if isinstance(p.grad, DTensor) else None].append(p.grad)
    fold = optimizer is not None and set(groups) == {None} and folds_clipping(optimizer)
    if fold:
        optimizer.grad_scale = None
    if not groups:
        return 0.0
    sq = 0.0
    for grads in groups.values():
        # fp64 accumulation: torch's fp32 norm of large tensors depends on the summation order, enough
        # to make the same gradients report different norms under different shardings.
        if any(isinstance(g, DTensor) for g in grads):
            norms = [torch.linalg.vector_norm(g, 2.0, dtype=torch.float64) for g in grads]
        else:
            norms = norms_of(grads)
        n = torch.linalg.vector_norm(torch.stack(norms), 2.0)
        n = n.full_tensor() if isinstance(n, DTensor) else n
        sq += float(n) ** 2
    total = math.sqrt(sq)
    if max_norm > 0 and math.isfinite(total) and total > max_norm:
        coef = max_norm / (total + 1e-6)
        if fold:
            device = groups[None][0].device
            optimizer.grad_scale = torch.tensor(1.0 / coef, dtype=torch.float32, device=device)
            return total
        with torch.no_grad():
            for grads in groups.values():
                torch._foreach_mul_([_local(g) for g in grads], coef)
    return total
