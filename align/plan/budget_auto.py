"""`sampler.max_tokens=auto` resolved where the device is known: the token budget a micro-batch of
sampler=budget may hold.

On a CPU there is no accelerator memory to fill: the budget is the base step (`STEP` tokens). On CUDA
it is the largest multiple `STEP x k` (k = 1..`MAX_STEPS`) whose training-memory estimate
(align.plan.memory.estimate_memory, peak weights + grads + optimizer + activations + logits) stays
within the headroom of the device's memory (`headroom`): what is left is for the allocator's
fragmentation, the kernels' workspaces and the estimate's own error. That error differs by how the
blocks run: compiled blocks keep fewer tensors than the estimate counts (inductor's partitioner
recomputes elementwise ops in backward), eager blocks keep more, so the share is larger for compiled
blocks. Both shares are held to the measured peaks by tests/unit/plan/test_memory_vs_measured.py: at
its share, a configuration with the worst error of its kind measured peaks below `PEAK_SHARE` of the
device. Either way the budget holds the longest record (`data.max_seq_len` rounded up to
`sampler.pad_to_multiple_of`), which the sampler refuses to cut.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from align.config.data import SamplerKind
from align.config.rules import AUTO

STEP = 4096
"""The base budget and the unit the CUDA search multiplies."""
MAX_STEPS = 8
"""The CUDA search stops at STEP x MAX_STEPS tokens: the largest budget the bench has run."""
HEADROOM = {"compiled": 0.85, "eager": 0.75}
"""The share of the device's memory the estimate may fill, by how the decoder blocks run."""
PEAK_SHARE = 0.92
"""The share of the device a measured peak may reach when its estimate sits at the headroom."""


def headroom(cfg: Any, device: torch.device) -> tuple[float, str]:
    """The share of `device`'s memory the estimate of `cfg` may fill, and the kind of blocks it is for
    (trainer.compile=auto resolved as the trainer will resolve it)."""
    from align.plan.compile_auto import blocks_compile

    kind = "compiled" if blocks_compile(cfg, device.type) else "eager"
    return HEADROOM[kind], kind


def _device_bytes(device: torch.device, device_bytes: Optional[int]) -> Optional[int]:
    """The memory to plan for: `device_bytes` where the caller names it, else read from the device."""
    from align.plan.memory import device_memory

    return device_bytes if device_bytes is not None else device_memory(device)


def longest_record(cfg: Any) -> int:
    """`data.max_seq_len` rounded up to `sampler.pad_to_multiple_of`: the least budget the sampler accepts."""
    mult = cfg.sampler.pad_to_multiple_of
    return -(-cfg.data.max_seq_len // mult) * mult


def _with_budget(cfg: Any, tokens: int) -> Any:
    return dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, max_tokens=tokens))


def resolve_budget(cfg: Any, device: torch.device, device_bytes: Optional[int] = None,
                   prompt_tokens: Optional[int] = None) -> tuple[int, str]:
    """The budget `auto` stands for on `device`, and why. `device_bytes`: the device's memory (default:
    read from the device; a caller may name it to plan for a device it does not hold); `prompt_tokens`:
    grpo's longest prompt where known (`plan_rollout`)."""
    from align.plan.memory import estimate_memory

    floor = longest_record(cfg)
    if device.type != "cuda":
        return max(STEP, floor), (f"sampler.max_tokens=auto on {device.type}: {STEP} tokens (no accelerator "
                                  f"memory to fill), at least the longest record ({floor})")
    total = _device_bytes(device, device_bytes)
    if total is None:
        return max(STEP, floor), f"sampler.max_tokens=auto: the memory of {device} cannot be read: {STEP} tokens"
    share, kind = headroom(cfg, device)
    limit = int(share * total)
    fits = [STEP * k for k in range(1, MAX_STEPS + 1)
            if estimate_memory(_with_budget(cfg, max(STEP * k, floor)), device,
                               prompt_tokens=prompt_tokens).total <= limit]
    gib = 2**30
    within = f"{share:.2f} x {total / gib:.1f} GiB ({kind} blocks)"
    if not fits:
        return floor, (f"sampler.max_tokens=auto on {device}: no budget of {STEP} x k (k=1..{MAX_STEPS}) keeps the "
                       f"training-memory estimate within {within}: the longest record ({floor} tokens)")
    best = max(max(fits), floor)
    est = estimate_memory(_with_budget(cfg, best), device, prompt_tokens=prompt_tokens).total
    return best, (f"sampler.max_tokens=auto on {device}: the largest {STEP} x k (k=1..{MAX_STEPS}) whose "
                  f"training-memory estimate ({est / gib:.1f} GiB) is within {within}"
                  f", at least the longest record ({floor})")


def plan_budget(cfg: Any, device: torch.device, device_bytes: Optional[int] = None,
                prompt_tokens: Optional[int] = None) -> tuple[Any, Optional[dict[str, Any]]]:
    """`cfg` with `sampler.max_tokens` an int wherever sampler=budget, and the manifest's
    `sampler_budget` record (requested, resolved, why); None when the sampler takes no budget."""
    s = cfg.sampler
    if s.kind != SamplerKind.budget:
        return cfg, None
    if s.max_tokens != AUTO:
        return cfg, {"requested": s.max_tokens, "resolved": s.max_tokens, "why": "sampler.max_tokens as given"}
    tokens, why = resolve_budget(cfg, device, device_bytes, prompt_tokens)
    return _with_budget(cfg, tokens), {"requested": AUTO, "resolved": tokens, "why": why}


PARTITIONER_STEPS = 10
"""trainer.compile_memory_budget=auto tries 1, then (k / PARTITIONER_STEPS) for k = PARTITIONER_STEPS - 1 .. 0."""


def _with_memory_budget(cfg: Any, budget: Optional[float]) -> Any:
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, compile_memory_budget=budget))


def resolve_memory_budget(cfg: Any, device: torch.device, device_bytes: Optional[int] = None,
                          prompt_tokens: Optional[int] = None) -> tuple[Optional[float], str]:
    """What `trainer.compile_memory_budget=auto` stands for, and why: null (torch's default) unless the
    blocks compile on CUDA and the least micro-batch the run can take (under sampler=budget with
    `max_tokens=auto`, the longest record) does not fit the headroom with it; then the largest share
    k / PARTITIONER_STEPS that does, so the longest rows fit by recomputing inside the blocks rather than
    not at all. Where none fits, null: preflight then refuses the estimate."""
    from align.plan.memory import estimate_memory, tokens_per_micro_batch

    key = "trainer.compile_memory_budget=auto"
    share, kind = headroom(cfg, device)
    if device.type != "cuda" or kind != "compiled":
        return None, f"{key}: null (torch's default): {kind} blocks on {device.type}"
    total = _device_bytes(device, device_bytes)
    if total is None:
        return None, f"{key}: null (torch's default): the memory of {device} cannot be read"
    least = cfg
    if cfg.sampler.kind == SamplerKind.budget and cfg.sampler.max_tokens == AUTO:
        least = _with_budget(cfg, longest_record(cfg))
    limit, gib = int(share * total), 2**30
    if estimate_memory(_with_memory_budget(least, None), device, prompt_tokens=prompt_tokens).total <= limit:
        return None, f"{key}: null (torch's default): the least micro-batch fits {share:.2f} x {total / gib:.1f} GiB"
    for k in range(PARTITIONER_STEPS - 1, -1, -1):
        budget = k / PARTITIONER_STEPS
        est = estimate_memory(_with_memory_budget(least, budget), device, prompt_tokens=prompt_tokens).total
        if est <= limit:
            return budget, (f"{key}: {budget}, the largest share whose estimate at the least micro-batch "
                            f"({est / gib:.1f} GiB at {tokens_per_micro_batch(least, prompt_tokens)} tokens) is within "
                            f"{share:.2f} x {total / gib:.1f} GiB")
    return None, f"{key}: null (torch's default): no share fits {share:.2f} x {total / gib:.1f} GiB"


def plan_memory_budget(cfg: Any, device: torch.device, device_bytes: Optional[int] = None,
                       prompt_tokens: Optional[int] = None) -> tuple[Any, dict[str, Any]]:
    """`cfg` with `trainer.compile_memory_budget` null or a number, and the manifest's `memory_budget`
    record (requested, resolved, why)."""
    requested = cfg.trainer.compile_memory_budget
    if requested != AUTO:
        return cfg, {"requested": requested, "resolved": requested, "why": "trainer.compile_memory_budget as given"}
    budget, why = resolve_memory_budget(cfg, device, device_bytes, prompt_tokens)
    return _with_memory_budget(cfg, budget), {"requested": AUTO, "resolved": budget, "why": why}


def resolve_generation_batch_size(cfg: Any, device: torch.device, device_bytes: Optional[int] = None,
                                  prompt_tokens: Optional[int] = None) -> tuple[int, str]:
    """The rows per engine call `auto` stands for on `device`, and why. `device_bytes`: the device's
    memory (default: read from the device)."""
    from align.plan.generation_auto import CPU_ROWS, rollout_rows
    from align.plan.memory import cache_held, estimate_memory, kv_cache_bytes, resident_bytes

    key, rollout = "objective.generation_batch_size", rollout_rows(cfg)
    requested = cfg.objective.generation_batch_size
    if requested != AUTO:
        return requested, f"{key}={requested} as configured"
    whole = f"the whole rollout ({cfg.objective.prompts_per_rollout} x {cfg.objective.group_size} = {rollout} rows)"
    if device.type != "cuda":
        return min(rollout, CPU_ROWS), (f"{key}=auto on {device.type}: {whole} in one call, at most {CPU_ROWS} "
                                        "rows (no accelerator memory to fill)")
    total = _device_bytes(device, device_bytes)
    if total is None:
        return min(rollout, CPU_ROWS), (f"{key}=auto: the memory of {device} cannot be read: {whole}, at most "
                                        f"{CPU_ROWS} rows per call")
    share, kind = headroom(cfg, device)
    limit, resident = int(share * total), resident_bytes(cfg, device, prompt_tokens)
    per_row = kv_cache_bytes(cfg, device, 1, prompt_tokens)
    beside = "weights, optimizer state, reference, generation copy and reward model"
    if cache_held(cfg):  # the engine keeps its cache through the update: the step's working set beside it
        from align.plan.chunk_auto import plan_loss_chunk

        sized = plan_loss_chunk(cfg, device)[0]  # resolved before this in plan_sizes; here for direct callers
        if sized.trainer.compile_memory_budget == AUTO:  # resolved after this: its largest, torch's default
            sized = _with_memory_budget(sized, None)
        est = estimate_memory(sized, device, prompt_tokens=prompt_tokens)
        resident = dataclasses.replace(est, kv_cache=0, kv_cache_held=False).total
        beside += " and the update's working set (the cache is held between calls)"
    fit = max(limit - resident, 0) // max(per_row, 1)
    gib = 2**30
    within = (f"{share:.2f} x {total / gib:.1f} GiB ({kind} blocks) less {resident / gib:.1f} GiB of {beside}, "
              f"at {per_row / 2**20:.1f} MiB of KV cache per row")
    if fit >= rollout:
        return rollout, f"{key}=auto on {device}: {whole} in one call: its KV cache fits {within}"
    rows = max(1, fit)
    return rows, f"{key}=auto on {device}: {rows} rows per call, the most of {whole} whose KV cache fits {within}"


def plan_generation(cfg: Any, device: torch.device, device_bytes: Optional[int] = None,
                    prompt_tokens: Optional[int] = None) -> tuple[Any, Optional[dict[str, Any]]]:
    """`cfg` with the engine's settings resolved for `device`, and their record for the manifest
    (`model.extra.generation`: dtype and batch_size, each requested, resolved, why); None under an
    objective that generates nothing. The objective's rule (align/objectives/plan_terms.py) resolves the
    dtype first, then the rows per call by `resolve_generation_batch_size`: their memory counts the copy."""
    from align.objectives.plan_terms import terms_for

    return terms_for(cfg).plan_generation(
        cfg, device, lambda c: resolve_generation_batch_size(c, device, device_bytes, prompt_tokens))


def plan_rollout(cfg: Any) -> tuple[Optional[int], Optional[dict[str, Any]]]:
    """The longest prompt an objective that generates keeps (grpo: align.data.prompts.longest_prompt),
    which bounds every rollout sequence, and the manifest's `rollout_width` record (requested: the bound
    from the config; resolved: the longest prompt + `objective.max_new_tokens`; why); (None, None) under
    an objective that generates nothing (align/objectives/plan_terms.py)."""
    from align.objectives.plan_terms import terms_for

    return terms_for(cfg).plan_rollout(cfg)


def plan_sizes(cfg: Any, device: torch.device, device_bytes: Optional[int] = None
               ) -> tuple[Any, dict[str, Optional[dict[str, Any]]]]:
    """Every size `auto` leaves to the device, in the order they depend on each other: the loss's chunk
    (align.plan.chunk_auto), grpo's generation copy and rows per engine call
    (`plan_generation`: what is left beside the weights, optimizer state, reference and
    copy), the partitioner's memory budget (what the least micro-batch needs), then the token budget,
    whose estimate counts all of them; under grpo each at the rollout's real width (`plan_rollout`).
    `cfg` with all of them resolved, and the manifest's `loss_chunk`, `memory_budget` and
    `sampler_budget` records, plus under grpo `generation` (`model.extra.generation`) and `rollout_width`."""
    from align.plan.chunk_auto import plan_loss_chunk

    prompt_tokens, rollout = plan_rollout(cfg)
    cfg, chunk = plan_loss_chunk(cfg, device)
    cfg, generation = plan_generation(cfg, device, device_bytes, prompt_tokens)
    cfg, memory_budget = plan_memory_budget(cfg, device, device_bytes, prompt_tokens)
    cfg, budget = plan_budget(cfg, device, device_bytes, prompt_tokens)
    sizes = {"loss_chunk": chunk, "memory_budget": memory_budget, "sampler_budget": budget}
    if generation is not None:
        sizes.update(generation=generation, rollout_width=rollout)
    return cfg, sizes
