"""Schemas of the objective and reward groups: what is optimised, and which of its keys each
objective reads."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, Optional

from align.config.base import AUTO, _only, _read, _require
from align.errors import ConfigError
from align.objectives.advantages import Estimator as AdvantageKind  # defined beside its rules of no signal

# ------------------------------------------------------------------------------------- objective


class ObjectiveKind(StrEnum):
    sft = "sft"
    dpo = "dpo"
    grpo = "grpo"


class ReferenceKind(StrEnum):
    auto = "auto"
    model = "model"
    adapters_off = "adapters_off"
    precomputed = "precomputed"
    none = "none"


class ReferenceDtype(StrEnum):
    same = "same"
    bf16 = "bf16"
    fp32 = "fp32"


class LossAgg(StrEnum):
    token_mean = "token_mean"
    """Every completion token of the optimizer step weighs the same (over all ranks)."""
    seq_mean_token_mean = "seq_mean_token_mean"
    """Mean over completions of each completion's token mean (the GRPO paper's)."""
    seq_mean_token_sum = "seq_mean_token_sum"
    """Mean over completions of each completion's token sum (Dr. GRPO's, up to a constant)."""


class RatioLevel(StrEnum):
    token = "token"
    """One importance ratio per token (PPO, GRPO)."""
    sequence = "sequence"
    """One ratio per completion, exp of the mean per-token log-ratio (GSPO)."""


class ISCorrection(StrEnum):
    none = "none"
    """The loss's ratio is against the trainer's own recomputed rollout log-probs; the engine's are only compared."""
    tis = "tis"
    """Truncated importance sampling: each token's loss times min(p_trainer / p_engine, objective.is_cap)."""


class GenerationDtype(StrEnum):
    auto = "auto"
    """Resolved where the device is known (align/plan/generation_auto.py): bf16 on one CUDA device
    under bf16 autocast when the training weights are not bf16 already, else same."""
    same = "same"
    """The engine generates with the training model itself (shared weights, no sync)."""
    bf16 = "bf16"
    """The engine generates with a bfloat16 copy, synced before every rollout."""
    fp32 = "fp32"
    """The engine generates with a float32 copy, synced before every rollout."""


@dataclass
class ObjectiveConfig:
    """What the run optimises (the `objective` group); align/objectives/base.py is the seam. Each key
    after `kind` is read by the objectives `_READ_BY` names; under any other it must stay at its default."""

    kind: ObjectiveKind = ObjectiveKind.sft
    """sft: cross-entropy on the loss-masked tokens (chat: the assistant turns), averaged per loss
    token over the accumulation window on all ranks. dpo: a preference loss on pairs (`loss`). grpo:
    RL with verifiable rewards on prompts (`reward.weights`), align/objectives/grpo.py."""
    loss: str = "sigmoid"
    """dpo: sigmoid (DPO), ipo, hinge, robust, conservative (label-smoothed sigmoid), simpo and orpo
    (both reference-free); definitions in align/objectives/preference_losses.py."""
    beta: float = 0.1
    """dpo: the loss's beta (for orpo, the weight of the odds-ratio term: the paper's lambda)."""
    label_smoothing: float = 0.0
    """dpo, robust and conservative only: the assumed label-flip rate, in [0, 0.5)."""
    simpo_gamma: float = 0.0
    """dpo, simpo only: the target reward margin."""
    reference: ReferenceKind = ReferenceKind.auto
    """dpo, grpo: what the loss is measured against. model: a frozen copy of the starting policy;
    adapters_off: the LoRA base (adapters disabled, no copy); precomputed (dpo only): the starting
    policy's log-probs computed once and cached on their meaning; none: no reference. auto: dpo: none
    for simpo/orpo, adapters_off with LoRA, else precomputed where the run reads at least one epoch of
    the pairs and model where it reads less; grpo: none when kl_coef is 0, else adapters_off with LoRA,
    else model."""
    reference_dtype: ReferenceDtype = ReferenceDtype.same
    """dpo, grpo, reference=model: the frozen copy's parameter dtype (bf16 halves its memory)."""
    gate_tolerance: Optional[float] = None
    """dpo: the step-0 gate's bound per target token (nats) on |batched - alone| summed log-probs and
    on |policy - reference|; null: 1e-4 in fp32, 5e-2 under bf16 autocast, and 5e-2 for the reference
    check of a bf16 frozen copy (reference_dtype=bf16) (docs/objectives.md)."""
    group_size: int = 16
    """grpo: completions generated per prompt (the group the advantages are relative to)."""
    prompts_per_rollout: int = 16
    """grpo: prompts per rollout on each rank (the rollout holds prompts_per_rollout * group_size completions)."""
    updates_per_rollout: int = 1
    """grpo: optimizer steps per rollout: the rollout is cut into this many parts, one per step, each
    into `trainer.grad_accum` micro-batches (1: on-policy)."""
    max_new_tokens: int = 4
    """grpo: most tokens generated per completion (a stop token counts)."""
    temperature: float = 1.0
    """grpo: sampling temperature (> 0); the loss's log-probs are of the same tempered distribution."""
    top_p: float = 1.0
    """grpo: nucleus sampling's kept probability mass, in (0, 1]."""
    advantage: AdvantageKind = AdvantageKind.grpo
    """grpo: the advantage estimator (grpo, dr_grpo, rloo); align/objectives/advantages.py."""
    loss_agg: LossAgg = LossAgg.token_mean
    """grpo: how per-token losses are averaged over the optimizer step (align/objectives/policy_loss.py)."""
    ratio_level: RatioLevel = RatioLevel.token
    """grpo: token (PPO-style clipped ratio per token) or sequence (GSPO)."""
    clip_low: float = 0.2
    """grpo: the ratio is clipped below at 1 - clip_low."""
    clip_high: float = 0.2
    """grpo: the ratio is clipped above at 1 + clip_high (DAPO's clip-higher raises it, e.g. 0.28)."""
    kl_coef: float = 0.0
    """grpo: weight of the per-token KL to the reference (k3 estimator); 0: no reference is used."""
    is_correction: ISCorrection = ISCorrection.none
    """grpo: none, or tis (truncated importance sampling of the trainer's over the engine's log-probs)."""
    is_cap: float = 2.0
    """grpo, is_correction=tis: the truncation of the importance weight."""
    dynamic_sampling: bool = False
    """grpo: replace zero-variance groups (all completions scored the same) by fresh prompts' groups
    (DAPO's dynamic sampling), up to `dynamic_sampling_rounds` extra generations per rollout."""
    dynamic_sampling_rounds: int = 3
    """grpo, dynamic_sampling: extra generation rounds per rollout at most; groups still without signal
    after them are kept (their advantage is 0) and counted."""
    generation_dtype: GenerationDtype = GenerationDtype.auto
    """grpo: same: the engine generates with the training model; bf16/fp32: with a copy in that dtype,
    synced and hash-checked before every rollout (a planted train/rollout mismatch, or a cheaper engine);
    a copy needs parallel=single. auto: bf16 where the device is CUDA, parallel=single, the forward
    autocasts to bf16 (trainer.precision auto or bf16), the weights are not bf16 already (`model.dtype`)
    and LoRA is off (the copy then decodes with the numbers the policy's matmuls use anyway, and the
    policy's decoder blocks never see decode shapes, so `trainer.compile=auto` can compile them); else
    same. The manifest's `model.extra.generation.dtype` says what it resolved to and why."""
    generation_batch_size: Any = AUTO
    """grpo: rows (prompt x completion) per call of the engine's backend: an int >= 1, or auto. auto:
    the whole rollout (prompts_per_rollout x group_size rows) in one call, capped on CUDA where the KV
    cache of that many rows at the longest prompt + max_new_tokens would not fit what the memory
    estimate leaves beside the weights, optimizer state, reference and generation copy within the
    token budget's headroom (align/plan/budget_auto.py `resolve_generation_batch_size`); on a CPU, or
    where the device's memory cannot be read, capped at 256 rows, the fixed default before auto: every
    CPU rollout keeps the calls it had. The manifest's `model.extra.generation.batch_size` says what it resolved to
    and why."""

    def ignored(self, key: str) -> dict[str, str]:
        """The keys the composed objective does not read, and which objectives do (`_READ_BY`)."""
        return _read({f.name: _only("objective", self.kind, sorted(_READ_BY[f.name])) for f in fields(self)
                      if f.name != "kind"})

    def __post_init__(self) -> None:
        if self.kind == ObjectiveKind.dpo:
            self._check_dpo()
        elif self.kind == ObjectiveKind.grpo:
            self._check_grpo()

    def _check_dpo(self) -> None:
        from align.objectives.preference_spec import check_hyperparameters, needs_reference

        try:
            check_hyperparameters(self.loss, beta=self.beta, label_smoothing=self.label_smoothing,
                                  simpo_gamma=self.simpo_gamma)
        except ValueError as e:
            key, _, msg = str(e).partition(": ")
            raise ConfigError(f"objective.{key}" if key != "loss" else "objective.loss", msg) from None
        free = not needs_reference(self.loss)
        if free:
            _require(self.reference in (ReferenceKind.auto, ReferenceKind.none), "objective.reference",
                     f"loss={self.loss} is reference-free: use auto or none", self.reference.value)
        else:
            _require(self.reference != ReferenceKind.none, "objective.reference",
                     f"loss={self.loss} needs a reference: auto, model, adapters_off or precomputed", "none")
        if self.gate_tolerance is not None:
            _require(math.isfinite(self.gate_tolerance) and self.gate_tolerance > 0, "objective.gate_tolerance",
                     "must be a finite number > 0", self.gate_tolerance)

    def _check_grpo(self) -> None:
        for key in ("group_size", "prompts_per_rollout", "updates_per_rollout", "max_new_tokens"):
            _require(getattr(self, key) >= 1, f"objective.{key}", "must be >= 1", getattr(self, key))
        rows = self.generation_batch_size
        _require(rows == AUTO or (isinstance(rows, int) and not isinstance(rows, bool) and rows >= 1),
                 "objective.generation_batch_size", "must be an int >= 1 or auto", rows)
        _require(math.isfinite(self.temperature) and self.temperature > 0, "objective.temperature",
                 "must be a finite number > 0 (a group of greedy completions would all be the same)", self.temperature)
        _require(0 < self.top_p <= 1, "objective.top_p", "must be in (0, 1]", self.top_p)
        _require(0 <= self.clip_low < 1, "objective.clip_low", "must be in [0, 1)", self.clip_low)
        _require(math.isfinite(self.clip_high) and self.clip_high >= 0, "objective.clip_high", "must be >= 0",
                 self.clip_high)
        _require(math.isfinite(self.kl_coef) and self.kl_coef >= 0, "objective.kl_coef", "must be >= 0", self.kl_coef)
        _require(math.isfinite(self.is_cap) and self.is_cap >= 1, "objective.is_cap", "must be >= 1", self.is_cap)
        _require(self.dynamic_sampling_rounds >= 0, "objective.dynamic_sampling_rounds", "must be >= 0",
                 self.dynamic_sampling_rounds)
        _require(self.reference != ReferenceKind.precomputed, "objective.reference",
                 "grpo's completions are new every rollout: a precomputed reference cannot cover them; "
                 "use auto, model, adapters_off or none", self.reference.value)
        if self.kl_coef > 0:
            _require(self.reference != ReferenceKind.none, "objective.reference",
                     "kl_coef > 0 needs a reference: auto, model or adapters_off", "none")
        else:
            _require(self.reference in (ReferenceKind.auto, ReferenceKind.none), "objective.reference",
                     "kl_coef=0 reads no reference: leave it at auto (or none), or set objective.kl_coef",
                     self.reference.value)


_DPO, _GRPO = frozenset({ObjectiveKind.dpo}), frozenset({ObjectiveKind.grpo})
_READ_BY: dict[str, frozenset[ObjectiveKind]] = {
    "loss": _DPO, "beta": _DPO, "label_smoothing": _DPO, "simpo_gamma": _DPO, "gate_tolerance": _DPO,
    "reference": _DPO | _GRPO, "reference_dtype": _DPO | _GRPO,
    **{k: _GRPO for k in ("group_size", "prompts_per_rollout", "updates_per_rollout", "max_new_tokens", "temperature",
                          "top_p", "advantage", "loss_agg", "ratio_level", "clip_low", "clip_high", "kl_coef",
                          "is_correction", "is_cap", "dynamic_sampling", "dynamic_sampling_rounds",
                          "generation_dtype", "generation_batch_size")},
}
"""Which objectives read each key of ObjectiveConfig (every key after `kind` is listed)."""


@dataclass
class RewardConfig:
    """The reward of RL objectives (objective=grpo): verifiers of align/rewards, weighted and summed."""

    weights: dict[str, float] = field(default_factory=dict)
    """Verifier name -> weight, e.g. {gsm8k: 1.0, format: 0.1} (docs/rewards.md); each completion is
    scored against its prompt's reference. `python` weighs `reward.function`. Empty under objectives that
    read no reward."""
    function: Optional[str] = None
    """Your own reward, weighted as `python` in `weights` (reward=python): `pkg.module:fn` or
    `/path/to/file.py:fn`, a function with TRL's reward-function signature `fn(prompts, completions,
    **kwargs)` returning one number per completion (docs/rewards.md). Imported and checked in preflight."""
