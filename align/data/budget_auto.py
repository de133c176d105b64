"""`sampler.max_tokens=auto` resolved where the device is known: the token budget a micro-batch of
sampler=budget may hold.

On a CPU there is no accelerator memory to fill: the budget is the base step (`STEP` tokens). On CUDA
it is the largest multiple `STEP x k` (k = 1..`MAX_STEPS`) whose training-memory estimate
(align.models.memory.estimate_memory, peak weights + grads + optimizer + activations + logits) stays
within `HEADROOM` of the device's memory: the estimate is an upper bound of the kept tensors, not of the
allocator's fragmentation and the kernels' workspaces, which the headroom is left for. Either way the
budget holds the longest record (`data.max_seq_len` rounded up to `sampler.pad_to_multiple_of`), which
the sampler refuses to cut.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from align.config.base import AUTO
from align.config.data import SamplerKind

STEP = 4096
"""The base budget and the unit the CUDA search multiplies."""
MAX_STEPS = 8
"""The CUDA search stops at STEP x MAX_STEPS tokens: the largest budget the bench has run."""
HEADROOM = 0.75
"""The share of the device's memory the estimate may fill."""


def longest_record(cfg: Any) -> int:
    """`data.max_seq_len` rounded up to `sampler.pad_to_multiple_of`: the least budget the sampler accepts."""
    mult = cfg.sampler.pad_to_multiple_of
    return -(-cfg.data.max_seq_len // mult) * mult


def _with_budget(cfg: Any, tokens: int) -> Any:
    return dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, max_tokens=tokens))


def resolve_budget(cfg: Any, device: torch.device, device_bytes: Optional[int] = None) -> tuple[int, str]:
    """The budget `auto` stands for on `device`, and why. `device_bytes`: the device's memory (default:
    read from the device; a caller may name it to plan for a device it does not hold)."""
    from align.models.memory import device_memory, estimate_memory

    floor = longest_record(cfg)
    if device.type != "cuda":
        return max(STEP, floor), (f"sampler.max_tokens=auto on {device.type}: {STEP} tokens (no accelerator "
                                  f"memory to fill), at least the longest record ({floor})")
    total = device_bytes if device_bytes is not None else device_memory(device)
    if total is None:
        return max(STEP, floor), f"sampler.max_tokens=auto: the memory of {device} cannot be read: {STEP} tokens"
    limit = int(HEADROOM * total)
    fits = [STEP * k for k in range(1, MAX_STEPS + 1)
            if estimate_memory(_with_budget(cfg, max(STEP * k, floor)), device).total <= limit]
    gib = 2**30
    if not fits:
        return floor, (f"sampler.max_tokens=auto on {device}: no budget of {STEP} x k (k=1..{MAX_STEPS}) keeps the "
                       f"training-memory estimate within {HEADROOM:.2f} x {total / gib:.1f} GiB: the longest "
                       f"record ({floor} tokens)")
    best = max(max(fits), floor)
    est = estimate_memory(_with_budget(cfg, best), device).total
    return best, (f"sampler.max_tokens=auto on {device}: the largest {STEP} x k (k=1..{MAX_STEPS}) whose "
                  f"training-memory estimate ({est / gib:.1f} GiB) is within {HEADROOM:.2f} x {total / gib:.1f} GiB"
                  f", at least the longest record ({floor})")


def plan_budget(cfg: Any, device: torch.device, device_bytes: Optional[int] = None
                ) -> tuple[Any, Optional[dict[str, Any]]]:
    """`cfg` with `sampler.max_tokens` an int wherever sampler=budget, and the manifest's
    `sampler_budget` record (requested, resolved, why); None when the sampler takes no budget."""
    s = cfg.sampler
    if s.kind != SamplerKind.budget:
        return cfg, None
    if s.max_tokens != AUTO:
        return cfg, {"requested": s.max_tokens, "resolved": s.max_tokens, "why": "sampler.max_tokens as given"}
    tokens, why = resolve_budget(cfg, device, device_bytes)
    return _with_budget(cfg, tokens), {"requested": AUTO, "resolved": tokens, "why": why}

