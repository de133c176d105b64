"""GRPO's terms of the job's plan (align/objectives/plan_terms.py): a rollout's micro-batches, a KL
reference, the engine's copy and KV cache, and the reward model it scores with (`reward.path`); the keys
that lower them, and its auto rules. Read from the config alone (no torch; the reward model's shapes from
its config.json, on the meta device), before any objective is built."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from align.config import GenerationDtype, ReferenceKind
from align.objectives.plan_terms import Lever, PlanTerms, ScoringModel, budget_cut, frozen_copy
from align.plan.generation_auto import (
    COPY_BYTES,
    generation_rows,
    kv_cache_tokens,
    resolve_generation_dtype,
    rollout_rows,
    rollout_width,
)


class GRPOTerms(PlanTerms):
    """GRPO: micro-batches cut from a rollout of `prompts_per_rollout x group_size` completions, a KL
    reference, and the engine's copy and KV cache, which live between optimizer steps."""

    def tokens_per_micro_batch(self, cfg: Any, prompt_tokens: Optional[int]) -> int:
        """The rollout's completions cut into `updates_per_rollout x trainer.grad_accum` micro-batches, each
        at most `rollout_width` wide (padded to `sampler.pad_to_multiple_of`), or under sampler=budget into
        micro-batches of at most `max_tokens`."""
        if budget_cut(cfg):
            return super().tokens_per_micro_batch(cfg, prompt_tokens)
        o = cfg.objective
        seqs = -(-o.prompts_per_rollout * o.group_size // (o.updates_per_rollout * cfg.trainer.grad_accum))
        mult = cfg.sampler.pad_to_multiple_of
        return seqs * (-(-rollout_width(cfg, prompt_tokens) // mult) * mult)

    def reference_bytes(self, cfg: Any, params: int, wbytes: int) -> int:
        from align.objectives.reference import kl_reference

        return frozen_copy(cfg, params, wbytes) if kl_reference(cfg) == ReferenceKind.model else 0

    def generation_copy_bytes(self, cfg: Any, params: int, device_type: str) -> int:
        """Its parameters in `objective.generation_dtype` where that is bf16 or fp32 (auto resolved as the
        trainer will on `device_type`)."""
        return params * COPY_BYTES.get(resolve_generation_dtype(cfg, device_type)[0], 0)

    def kv_cache(self, cfg: Any, device_type: str, rows: Optional[int], prompt_tokens: Optional[int]
                 ) -> tuple[int, Optional[int]]:
        """`kv_cache_tokens` of `rows` rows (default `generation_rows`), in the generation copy's dtype."""
        dtype = resolve_generation_dtype(cfg, device_type)[0]
        rows = generation_rows(cfg) if rows is None else rows
        return kv_cache_tokens(cfg, rows, prompt_tokens), COPY_BYTES.get(dtype)

    def scoring_model(self, cfg: Any, device_type: str, prompt_tokens: Optional[int]) -> Optional[ScoringModel]:
        """`reward.path`'s model (align/objectives/scoring_model.py) in the dtype it loads in on `device_type`,
        run on `reward.model_batch_size` completions at a time (at most a generation round's) at the rollout's
        width: the prompt and completion in the policy's tokens, which the reward model's template and
        tokenizer may render a little longer or shorter."""
        if getattr(cfg.reward, "path", None) is None:
            return None
        from align.objectives.scoring_model import meta_scoring_model, scoring_dtype

        rows = min(cfg.reward.model_batch_size, rollout_rows(cfg))
        nbytes = {"bfloat16": 2, "float32": 4}[scoring_dtype(device_type)]
        return ScoringModel(meta_scoring_model(cfg.reward.path), nbytes, rows * rollout_width(cfg, prompt_tokens))

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
            return [f"objective={cfg.objective.kind} with objective.generation_dtype resolved to same generates "
                    "through the policy's blocks: decode shapes no dynamic graph covers (a generation copy keeps "
                    "them out)"]
        return []

    def plan_rollout(self, cfg: Any) -> tuple[Optional[int], Optional[dict[str, Any]]]:
        """The longest prompt the run keeps (read as the objective reads them:
        align.data.prompts.longest_prompt), which bounds every rollout sequence, and the record: requested,
        the bound from the config; resolved, the longest prompt + `objective.max_new_tokens`; why."""
        from align.data.prompts import longest_prompt

        longest, count = longest_prompt(cfg)
        width, new = rollout_width(cfg, longest), cfg.objective.max_new_tokens
        if getattr(cfg.objective, "max_turns", 1) > 1:  # distill shares these terms, single-turn
            return longest, {"requested": cfg.data.max_seq_len, "resolved": width, "prompt_tokens": longest,
                             "why": f"objective.max_turns={cfg.objective.max_turns}: a trajectory grows by turns and "
                                    f"tool messages up to data.max_seq_len={cfg.data.max_seq_len}"}
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
