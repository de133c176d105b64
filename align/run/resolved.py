"""What the built run resolved to, for the manifest (align/run/record.py writes it), and the two gates
before step 1: read from the trainer once `Trainer.build` returns, never from its config alone."""

from __future__ import annotations

from typing import Any, Optional

from align.data.stats import sampler_stats
from align.models.build import resolved_backends
from align.models.family import family_spec
from align.probes.mask import assert_masks
from align.probes.sdpa import sdpa_kernel_family


def describe(t: Any) -> dict[str, Any]:
    """The model as its own config reads back, device and world, autocast, the data's provenance, the
    sampler's epoch-0 plan and the objective's own record."""
    fast = getattr(t.autocast(), "fast_dtype", None)
    return {"model": {**t.model_info, **resolved_backends(t.model, family_spec(t.cfg.model).is_moe)},
            "device": t.env.device, "world_size": t.env.world,
            "autocast_dtype": str(fast).removeprefix("torch.") if fast is not None else None,
            "data": {"stats": dict(getattr(t.data, "stats", {}) or {}),
                     "meta": dict(getattr(t.data, "meta", None) or {})},
            "sampler_stats": sampler_stats(t.stream), "objective": t.objective.describe()}


def check_masks(t: Any) -> dict[str, Any]:
    """The mask gate before step 1 (align/probes/mask.py): raises ConfigError on a wrong band."""
    report = assert_masks(t.model, t.data, t.stream.pad_id, autocast=t.autocast)
    return {"ok": True, **{k: report[k] for k in ("attn_implementation", "sliding_window", "by_type")}}


def check_objective(t: Any) -> dict[str, Any]:
    """The objective's gate on the micro-batch step 1 trains on; its report and record."""
    t.objective.gate(t.stream.peek().to(t.env.device))
    return t.objective.describe()


def sdpa_kernel_record(t: Any) -> tuple[Optional[str], Optional[list[str]], Optional[str]]:
    """(family, kernel symbols, why null) of one profiled forward of step 1's micro-batch (GPU)."""
    resolved = getattr(t.model.config, "_attn_implementation", None)
    return sdpa_kernel_family(t.model, t.stream.peek().to(t.env.device), t.autocast, resolved)
