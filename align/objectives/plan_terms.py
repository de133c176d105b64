"""What each objective adds to the job's plan (align/plan/): its terms of the training-memory estimate
(how its micro-batches are cut, a frozen reference, a generation copy and its KV cache), the keys that
lower them, and the auto rules that hold only for it. The plan asks `terms_for(cfg)` and never which
objective runs: each objective's class names its terms (`terms`), a subclass of `PlanTerms` defined
beside it, so a new objective brings its own terms in its own module.

Every method works from the config alone (the estimate runs in preflight, before any objective is
built), and none imports the plan's estimate: the plan hands a term what it needs of the device
(`plan_generation`'s `rows_that_fit`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

from align.config import ReferenceDtype, SamplerKind

Lever = tuple[str, Any]
"""(dotted config key, the value to try) of a change that may lower the estimate (align/plan/memory_levers.py)."""


class ScoringModel(NamedTuple):
    """A reward model an objective loads to score its completions (`reward=model`), as the plan counts it."""

    model: Any
    """The model on the meta device: its parameters and decoder layers, no weights."""
    element_bytes: int
    """Bytes per parameter and per activation: the dtype it is loaded and run in."""
    tokens: int
    """The most tokens one forward holds: rows per forward x the widest text."""


def budget_cut(cfg: Any) -> bool:
    """The sampler cuts micro-batches by a token budget that is known (resolved, or given)."""
    return cfg.sampler.kind == SamplerKind.budget and cfg.sampler.max_tokens is not None


def frozen_copy(cfg: Any, params: int, wbytes: int) -> int:
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
        if budget_cut(cfg):
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

    def scoring_model(self, cfg: Any, device_type: str, prompt_tokens: Optional[int]) -> Optional[ScoringModel]:
        """The reward model the objective scores its completions with, held beside the policy; None where it
        scores with none."""
        return None

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


def terms_for(cfg: Any) -> PlanTerms:
    """The plan terms of the objective `cfg` names: its registered class's `terms` (align/objectives/__init__.py)."""
    from align.objectives import objective_class

    return objective_class(cfg).terms()
