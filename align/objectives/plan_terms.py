"""What each objective adds to the job's plan (align/plan/): its terms of the training-memory estimate
(how its micro-batches are cut, a frozen reference, a generation copy and its KV cache), the keys that
lower them, and the auto rules that hold only for it. The plan asks `terms_for(cfg)` and never which
objective runs, so a new objective brings its own terms here beside its class.

Every method works from the config alone (the estimate runs in preflight, before any objective is
built), and none imports the plan's estimate: the plan hands a term what it needs of the device
(`plan_generation`'s `rows_that_fit`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from align.config import GenerationDtype, ObjectiveKind, ReferenceDtype, ReferenceKind, SamplerKind
from align.plan.generation_auto import (
    COPY_BYTES,
    generation_rows,
    kv_cache_tokens,
    resolve_generation_dtype,
    rollout_width,
)

Lever = tuple[str, Any]
"""(dotted config key, the value to try) of a change that may lower the estimate (align/plan/memory_levers.py)."""


def _budget(cfg: Any) -> bool:
    """The sampler cuts micro-batches by a token budget that is known (resolved, or given)."""
    return cfg.sampler.kind == SamplerKind.budget and cfg.sampler.max_tokens is not None


def _frozen_copy(cfg: Any, params: int, wbytes: int) -> int:
    """A frozen copy of the policy's `params` in `objective.reference_dtype` (`same`: the weights' bytes)."""
    return params * {ReferenceDtype.bf16: 2, ReferenceDtype.fp32: 4}.get(cfg.objective.reference_dtype, wbytes)


class PlanTerms:
    """The terms of an objective that trains on the sampler's rows, one sequence each, and keeps nothing
    beside the policy: SFT's, and the default the others override."""

    sequences_per_row = 1
    """Sequences one row of the sampler holds (a DPO pair: its two sides)."""

    def tokens_per_micro_batch(self, cfg: Any, prompt_tokens: Optional[int]) -> int:
        """The most tokens (padding included) one forward holds: under sampler=budget `max_tokens` bounds
        rows x padded width (a pair counts both its sides); shuffle and bucket take `micro_batch_size`
        rows at `data.max_seq_len`, the worst case."""
        if _budget(cfg):
            return cfg.sampler.max_tokens
        return cfg.sampler.micro_batch_size * self.sequences_per_row * cfg.data.max_seq_len

    def reference_bytes(self, cfg: Any, params: int, wbytes: int) -> int:
        """A frozen reference copy in its dtype; 0 where the objective keeps none."""
        return 0

    def generation_copy_bytes(self, cfg: Any, params: int, device_type: str) -> int:
        """The engine's copy of the weights; 0 where the objective generates nothing or with the policy."""
        return 0

    def kv_cache(self, cfg: Any, device_type: str, rows: Optional[int], prompt_tokens: Optional[int]
                 ) -> tuple[int, Optional[int]]:
        """(positions the KV cache of one engine call of `rows` rows holds, bytes per element or None for
        the training model's compute dtype); (0, None) where the objective generates nothing."""
        return 0, None

    def levers(self, cfg: Any, budget: bool) -> list[Lever]:
        """The objective's keys that cut its micro-batches, each halved (`budget`: sampler=budget, whose
        `max_tokens` the plan tries itself): rows and their width."""
        if budget:
            return []
        return [("sampler.micro_batch_size", cfg.sampler.micro_batch_size // 2),
                ("data.max_seq_len", cfg.data.max_seq_len // 2)]

    def compile_off(self, cfg: Any, device_type: str) -> list[str]:
        """Why `trainer.compile=auto` must leave this objective's policy blocks eager; none by default."""
        return []

    def plan_rollout(self, cfg: Any) -> tuple[Optional[int], Optional[dict[str, Any]]]:
        """(the longest prompt, the manifest's `rollout_width` record); (None, None): no rollouts."""
        return None, None

    def plan_generation(self, cfg: Any, device: Any, rows_that_fit: Callable[[Any], tuple[int, str]]
                        ) -> tuple[Any, Optional[dict[str, Any]]]:
        """`cfg` with the engine's settings resolved for `device`, and their record; (cfg, None): the
        objective generates nothing."""
        return cfg, None


class SFTTerms(PlanTerms):
    """SFT: chat rows through the sampler, nothing beside the policy."""


class DPOTerms(PlanTerms):
    """DPO: pairs through the sampler, two sequences each; a frozen copy where the reference is the model."""

    sequences_per_row = 2

    def reference_bytes(self, cfg: Any, params: int, wbytes: int) -> int:
        """DPO's `auto` is counted as the copy: whether it precomputes depends on the planned pair stream."""
        from align.objectives.reference import preference_reference

        return _frozen_copy(cfg, params, wbytes) if preference_reference(cfg) == ReferenceKind.model else 0


class GRPOTerms(PlanTerms):
    """GRPO: micro-batches cut from a rollout of `prompts_per_rollout x group_size` completions, a KL
    reference, and the engine's copy and KV cache, which live between optimizer steps."""

    def tokens_per_micro_batch(self, cfg: Any, prompt_tokens: Optional[int]) -> int:
        """The rollout's completions cut into `updates_per_rollout x trainer.grad_accum` micro-batches, each
        at most `rollout_width` wide (padded to `sampler.pad_to_multiple_of`), or under sampler=budget into
        micro-batches of at most `max_tokens`."""
        if _budget(cfg):
            return super().tokens_per_micro_batch(cfg, prompt_tokens)
        o = cfg.objective
        seqs = -(-o.prompts_per_rollout * o.group_size // (o.updates_per_rollout * cfg.trainer.grad_accum))
        mult = cfg.sampler.pad_to_multiple_of
        return seqs * (-(-rollout_width(cfg, prompt_tokens) // mult) * mult)

    def reference_bytes(self, cfg: Any, params: int, wbytes: int) -> int:
        from align.objectives.reference import kl_reference

        return _frozen_copy(cfg, params, wbytes) if kl_reference(cfg) == ReferenceKind.model else 0

    def generation_copy_bytes(self, cfg: Any, params: int, device_type: str) -> int:
        """Its parameters in `objective.generation_dtype` where that is bf16 or fp32 (auto resolved as the
        trainer will on `device_type`)."""
        return params * COPY_BYTES.get(resolve_generation_dtype(cfg, device_type)[0], 0)

    def kv_cache(self, cfg: Any, device_type: str, rows: Optional[int], prompt_tokens: Optional[int]
                 ) -> tuple[int, Optional[int]]:
        """`rows` (default `generation_rows`) x `kv_cache_tokens`, in the generation copy's dtype."""
        dtype = resolve_generation_dtype(cfg, device_type)[0]
        rows = generation_rows(cfg) if rows is None else rows
        return rows * kv_cache_tokens(cfg, prompt_tokens), COPY_BYTES.get(dtype)

    def levers(self, cfg: Any, budget: bool) -> list[Lever]:
        """What cuts a rollout's micro-batches and its generation: `sampler.micro_batch_size` and
        `data.max_seq_len` (a bound the real prompts sit under) are read by no grpo micro-batch."""
        o = cfg.objective
        out: list[Lever] = [] if budget else [("trainer.grad_accum", cfg.trainer.grad_accum * 2)]
        return out + [("objective.max_new_tokens", o.max_new_tokens // 2),
                      ("objective.prompts_per_rollout", o.prompts_per_rollout // 2),
                      ("objective.group_size", o.group_size // 2),
                      ("objective.generation_batch_size", o.generation_batch_size // 2),
                      ("objective.generation_dtype", GenerationDtype.same)]

    def compile_off(self, cfg: Any, device_type: str) -> list[str]:
        """Compiled blocks only beside a generation copy (auto resolved as the trainer will), so the
        policy's blocks never see decode shapes."""
        if resolve_generation_dtype(cfg, device_type)[0].value == "same":
            return ["objective=grpo with objective.generation_dtype resolved to same generates through the "
                    "policy's blocks: decode shapes no dynamic graph covers (a generation copy keeps them out)"]
        return []

    def plan_rollout(self, cfg: Any) -> tuple[Optional[int], Optional[dict[str, Any]]]:
        """The longest prompt the run keeps (read as the objective reads them:
        align.data.prompts.longest_prompt), which bounds every rollout sequence, and the record: requested,
        the bound from the config; resolved, the longest prompt + `objective.max_new_tokens`; why."""
        from align.data.prompts import longest_prompt

        longest, count = longest_prompt(cfg)
        width, new = rollout_width(cfg, longest), cfg.objective.max_new_tokens
        return longest, {"requested": cfg.data.max_seq_len, "resolved": width, "prompt_tokens": longest,
                         "why": f"the longest of {count} prompts is {longest} tokens, + objective.max_new_tokens="
                                f"{new}: no rollout sequence is longer than {width} tokens (data.max_seq_len="
                                f"{cfg.data.max_seq_len} only bounds it)"}

    def plan_generation(self, cfg: Any, device: Any, rows_that_fit: Callable[[Any], tuple[int, str]]
                        ) -> tuple[Any, Optional[dict[str, Any]]]:
        """The dtype first (align/plan/generation_auto.py), then the rows per engine call
        (`rows_that_fit`, the plan's: align/plan/budget_auto.py), whose memory counts the copy."""
        o = cfg.objective
        dtype, dtype_why = resolve_generation_dtype(cfg, device.type)
        cfg = dataclasses.replace(cfg, objective=dataclasses.replace(o, generation_dtype=dtype))
        rows, rows_why = rows_that_fit(cfg)
        cfg = dataclasses.replace(cfg, objective=dataclasses.replace(cfg.objective, generation_batch_size=rows))
        return cfg, {"dtype": {"requested": o.generation_dtype.value, "resolved": dtype.value, "why": dtype_why},
                     "batch_size": {"requested": o.generation_batch_size, "resolved": rows, "why": rows_why}}


TERMS: dict[ObjectiveKind, type[PlanTerms]] = {ObjectiveKind.sft: SFTTerms, ObjectiveKind.dpo: DPOTerms,
                                               ObjectiveKind.grpo: GRPOTerms}
"""Each objective's terms, beside its class (align.objectives.objective_class)."""


def terms_for(cfg: Any) -> PlanTerms:
    """The plan terms of the objective `cfg` names."""
    return TERMS[cfg.objective.kind]()
