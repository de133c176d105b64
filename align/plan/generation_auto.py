"""GRPO's engine settings resolved where the device is known: `objective.generation_dtype=auto`, and
what `objective.generation_batch_size=auto` starts from (docs/grpo.md, "Generation").

generation_dtype=auto is `bf16` on one CUDA device (parallel=single) whose forward autocasts to bf16
over weights that are not bf16 already, LoRA off: the engine then decodes from a bf16 copy, synced and
hash-checked before every rollout, with the numbers the policy's matmuls use anyway, and the policy's
decoder blocks never see decode shapes (so `trainer.compile=auto` may compile them:
align/plan/compile_auto.py). Everywhere else `same`: on a CPU nothing changes; sharded weights generate
in place; bf16 weights would only be duplicated; without bf16 autocast a bf16 copy would generate from
other numbers than the policy computes with.

generation_batch_size=auto is the whole rollout (`rollout_rows`) in one engine call, capped by the
KV cache that fits; it reads the memory estimate, so it is resolved with the other sizes auto leaves
to the device (align.plan.budget_auto.resolve_generation_batch_size); on a CPU it is capped at
`CPU_ROWS`.

The widths and rows a rollout's memory is counted at live here too (`rollout_width`, `kv_cache_tokens`,
`generation_rows`): grpo's terms of the memory estimate (align/objectives/grpo_terms.py) read them.

This module imports nothing but the config (and the engine's padding multiple, where it is asked for):
the memory estimate and the compile switch read the dtype's resolution from here.
"""

from __future__ import annotations

from typing import Any, Optional

from align.config.objective import GenerationDtype
from align.config.rules import AUTO

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


COPY_BYTES = {GenerationDtype.bf16: 2, GenerationDtype.fp32: 4}
"""Bytes per element of a generation copy by its dtype (`same` makes no copy)."""


def rollout_width(cfg: Any, prompt_tokens: Optional[int] = None) -> int:
    """grpo: the most tokens a rollout sequence holds: the longest prompt (`prompt_tokens`, known once the
    prompts are read: align.data.prompts.longest_prompt) + `objective.max_new_tokens`; unknown, its bound
    `data.max_seq_len` (a longer prompt is dropped or refused). Multi-turn trajectories (`objective.max_turns`
    > 1) grow by turns and tool messages up to that bound (align/objectives/multi_turn.py)."""
    if prompt_tokens is None or getattr(cfg.objective, "max_turns", 1) > 1:
        return cfg.data.max_seq_len
    return min(cfg.data.max_seq_len, prompt_tokens + cfg.objective.max_new_tokens)


def kv_cache_tokens(cfg: Any, rows: int, prompt_tokens: Optional[int] = None) -> int:
    """Positions an engine call of `rows` rows holds in its KV cache, over all rows, in the layout of
    the backend `objective.generation_backend` names (auto: the larger of align's and hf's,
    align/generation/engine.py `kv_positions`): the longest prompt (`rollout_width` less the new tokens)
    plus `max_new_tokens` per row (the dynamic cache grows to at most hf's)."""
    from align.generation.engine import EngineConfig, kv_positions

    new = cfg.objective.max_new_tokens
    return kv_positions(cfg.objective.generation_backend, rows, rollout_width(cfg, prompt_tokens) - new, new,
                        EngineConfig().pad_to_multiple_of)


def generation_rows(cfg: Any) -> int:
    """Rows of one engine call: `objective.generation_batch_size`, at most the rollout's rows (a call
    holds no more); auto, unresolved, counts as the whole rollout, the most it resolves to."""
    rows, rollout = cfg.objective.generation_batch_size, rollout_rows(cfg)
    return rollout if rows == AUTO else min(rows, rollout)


def require_generation_resolved(cfg: Any, where: str) -> None:
    """Both settings must be resolved (`plan_generation`) before an engine is built at `where`."""
    from align.config.rules import require_auto_resolved

    o = cfg.objective
    require_auto_resolved("objective.generation_dtype", o.generation_dtype, where,
                          "align.plan.budget_auto.plan_generation")
    require_auto_resolved("objective.generation_batch_size", o.generation_batch_size, where,
                          "align.plan.budget_auto.plan_generation")
