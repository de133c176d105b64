"""GRPO's engine settings resolved where the device is known: `objective.generation_dtype=auto` and
`objective.generation_batch_size=auto` (docs/grpo.md, "Generation").

generation_dtype=auto is `bf16` on one CUDA device (parallel=single) whose forward autocasts to bf16
over weights that are not bf16 already, LoRA off: the engine then decodes from a bf16 copy, synced and
hash-checked before every rollout, with the numbers the policy's matmuls use anyway, and the policy's
decoder blocks never see decode shapes (so `trainer.compile=auto` may compile them:
align/parallel/compile.py). Everywhere else `same`: on a CPU nothing changes; sharded weights generate
in place; bf16 weights would only be duplicated; without bf16 autocast a bf16 copy would generate from
other numbers than the policy computes with.

generation_batch_size=auto is the whole rollout (prompts_per_rollout x group_size rows) in one engine
call. On CUDA it is capped at the rows whose KV cache (align.models.memory.kv_cache_bytes) fits what is
left of the token budget's headroom share of the device (align.data.budget_auto.headroom) beside what
a rollout runs next to: weights, optimizer state, a frozen reference and the generation copy
(align.models.memory.resident_bytes; unsharded, the upper bound under FSDP). On a CPU, and where the
device's memory cannot be read, it is capped at `CPU_ROWS`.

Both are pure functions of the config and the device: the memory estimate, the compile switch and the
trainer resolve them alike.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Optional

from align.config.base import AUTO
from align.config.objective import GenerationDtype, ObjectiveKind

if TYPE_CHECKING:  # the dtype's resolver runs where no torch is imported yet (align.parallel.compile)
    import torch

CPU_ROWS = 256
"""generation_batch_size=auto on a CPU: at most this many rows per engine call, the fixed default before
auto. A CPU rollout of up to 256 rows (the embedded default's 16 x 16, every test's) stays one call,
and a larger one is cut as before."""


def resolve_generation_dtype(cfg: Any, device_type: str) -> tuple[GenerationDtype, str]:
    """What `objective.generation_dtype` means on `device_type` for the TrainConfig `cfg`, with why.
    Pure: no torch."""
    key, o = "objective.generation_dtype", cfg.objective
    if o.generation_dtype != GenerationDtype.auto:
        return o.generation_dtype, f"{key}={o.generation_dtype.value} as configured"
    why = []
    if device_type != "cuda":
        why.append(f"device {device_type}: no accelerator whose decoding a cheaper copy would speed up "
                   "(auto copies on CUDA)")
    if cfg.parallel.kind.value != "single":
        why.append(f"parallel={cfg.parallel.kind.value}: sharded weights generate in place (a copy needs "
                   "parallel=single)")
    if cfg.model.dtype == "bfloat16":
        why.append("model.dtype=bfloat16: the training weights are bf16 already; a copy would only duplicate them")
    if device_type == "cuda" and cfg.trainer.precision.value == "fp32":
        why.append("trainer.precision=fp32: the policy computes in fp32, a bf16 copy would generate from "
                   "other numbers")
    if cfg.model.lora.enabled:
        why.append("model.lora.enabled=true: a generation copy of an adapted model is not tested")
    if why:
        return GenerationDtype.same, f"{key}=auto resolved same (the engine generates with the training model): " \
            + "; ".join(why)
    weights = cfg.model.dtype or "float32"
    return GenerationDtype.bf16, (f"{key}=auto resolved bf16: one CUDA device, {weights} weights under bf16 "
                                  "autocast: the engine decodes from a bf16 copy synced and hash-checked before "
                                  "every rollout, and the policy's decoder blocks never see decode shapes")


def rollout_rows(cfg: Any) -> int:
    """Rows one generation round of a rollout holds on a rank: prompts_per_rollout x group_size."""
    return cfg.objective.prompts_per_rollout * cfg.objective.group_size


def resolve_generation_batch_size(cfg: Any, device: torch.device, device_bytes: Optional[int] = None
                                  ) -> tuple[int, str]:
    """The rows per engine call `auto` stands for on `device`, and why. `device_bytes`: the device's
    memory (default: read from the device)."""
    from align.data.budget_auto import _device_bytes, headroom
    from align.models.memory import kv_cache_bytes, resident_bytes

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
    limit, resident, per_row = int(share * total), resident_bytes(cfg, device), kv_cache_bytes(cfg, device, 1)
    fit = max(limit - resident, 0) // max(per_row, 1)
    gib = 2**30
    within = (f"{share:.2f} x {total / gib:.1f} GiB ({kind} blocks) less {resident / gib:.1f} GiB of weights, "
              f"optimizer state, reference and generation copy, at {per_row / 2**20:.1f} MiB of KV cache per row")
    if fit >= rollout:
        return rollout, f"{key}=auto on {device}: {whole} in one call: its KV cache fits {within}"
    rows = max(1, fit)
    return rows, f"{key}=auto on {device}: {rows} rows per call, the most of {whole} whose KV cache fits {within}"


def plan_generation(cfg: Any, device: torch.device, device_bytes: Optional[int] = None
                    ) -> tuple[Any, Optional[dict[str, Any]]]:
    """`cfg` with both engine settings resolved for `device`, and their record for the manifest
    (`model.extra.generation`: dtype and batch_size, each requested, resolved, why); None under an
    objective that generates nothing. The dtype first: the batch size's memory counts the copy."""
    o = cfg.objective
    if o.kind != ObjectiveKind.grpo:
        return cfg, None
    dtype, dtype_why = resolve_generation_dtype(cfg, device.type)
    cfg = dataclasses.replace(cfg, objective=dataclasses.replace(o, generation_dtype=dtype))
    rows, rows_why = resolve_generation_batch_size(cfg, device, device_bytes)
    cfg = dataclasses.replace(cfg, objective=dataclasses.replace(cfg.objective, generation_batch_size=rows))
    return cfg, {"dtype": {"requested": o.generation_dtype.value, "resolved": dtype.value, "why": dtype_why},
                 "batch_size": {"requested": o.generation_batch_size, "resolved": rows, "why": rows_why}}


def require_generation_resolved(cfg: Any, where: str) -> None:
    """Both settings must be resolved (`plan_generation`) before an engine is built at `where`."""
    from align.config.base import require_auto_resolved

    o = cfg.objective
    require_auto_resolved("objective.generation_dtype", o.generation_dtype, where,
                          "align.objectives.generation_auto.plan_generation")
    require_auto_resolved("objective.generation_batch_size", o.generation_batch_size, where,
                          "align.objectives.generation_auto.plan_generation")
