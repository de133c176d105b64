"""Schemas of the objective and reward groups: what is optimised, one class per objective."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional

from align.config.rules import AUTO, _require
from align.errors import ConfigError
from align.generation.engine import Backend
from align.objectives.advantages import Estimator as AdvantageKind  # defined beside its rules of no signal

# ------------------------------------------------------------------------------------- objective


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


OBJECTIVE_SCHEMAS: dict[str, type["ObjectiveConfig"]] = {}
"""Each objective's schema by its kind, filled as each class is defined (`ObjectiveConfig.__init_subclass__`):
conf/objective/<kind>.yaml composes it (ConfigStore `schema/objective/<kind>`, align/config/root.py). A new
objective's schema is a subclass in a module of align/config/ (`align.config.discover` imports them all)."""


def accepted_kinds() -> str:
    """The registered kinds, as a refusal lists them."""
    return ", ".join(OBJECTIVE_SCHEMAS)


def require_rollout_keys(o: Any, temperature_rule: str) -> None:
    """The sampling and rollout-size keys every objective that samples its own completions reads
    (objective=grpo's, objective=distill's), each refused in one line naming it."""
    for key in ("group_size", "prompts_per_rollout", "updates_per_rollout", "max_new_tokens"):
        _require(getattr(o, key) >= 1, f"objective.{key}", "must be >= 1", getattr(o, key))
    rows = o.generation_batch_size
    _require(rows == AUTO or (isinstance(rows, int) and not isinstance(rows, bool) and rows >= 1),
             "objective.generation_batch_size", "must be an int >= 1 or auto", rows)
    _require(math.isfinite(o.temperature) and o.temperature > 0, "objective.temperature", temperature_rule,
             o.temperature)
    _require(0 < o.top_p <= 1, "objective.top_p", "must be in (0, 1]", o.top_p)


@dataclass
class ObjectiveConfig:
    """What the run optimises (the `objective` group); align/objectives/interface.py is the seam. The keys
    every objective reads; each objective's class adds its own and declares its kind as the default of
    `kind`, which registers it (`OBJECTIVE_SCHEMAS`). Its option names that class in its defaults list
    (conf/objective/<kind>.yaml: `/schema/objective/<kind>`), so a key the composed objective does not read
    is an unknown key of its schema."""

    kind: str = "sft"
    """The objective, chosen with `objective=<kind>` (each option composes its own schema): one of the
    registered kinds (sft, dpo, grpo, kto, distill, reward_model)."""

    @property
    def option(self) -> str:
        """`objective=<kind>`, as messages name the composed objective (naming it is no branch on it)."""
        return f"objective={self.kind}"

    reads_pairs = False
    """The objective trains on a preference source (data=gsm8k_pairs or data=preference), not on chat
    records: the root config checks the data against it, so no list names these objectives."""
    reads_unpaired = False
    """The objective reads a preference source's records as unpaired examples (align/data/unpaired.py):
    preflight parses them as it does, not as pairs."""
    reads_margin = False
    """The objective reads a pair's `margin` (TRL's RewardTrainer margin column, align/data/margins.py): pairs
    that carry one are refused under any objective that does not, rather than trained as if it were not there."""
    samples_prompts = False
    """The objective reads prompts (align/data/prompts.py) and samples completions of them with the
    generation engine (objective=grpo's rollouts): the root config holds the prompt and rollout keys to it."""
    reads_reward = False
    """The objective scores its completions with the reward group (`reward.weights`)."""
    scalar_head = False
    """The objective trains the backbone under a scalar head (the family's AutoModelForSequenceClassification
    class, num_labels=1: align/models/scalar_head.py), not under the LM head: the model is built, refused
    where the family has no such class, and exported as that class."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if isinstance(kind, str):  # a class that declares its kind is that objective's schema
            if OBJECTIVE_SCHEMAS.get(kind, cls) is not cls:
                raise TypeError(f"objective kind {kind!r} is declared by {OBJECTIVE_SCHEMAS[kind].__qualname__} "
                                f"and {cls.__qualname__}")
            OBJECTIVE_SCHEMAS[kind] = cls

    def __post_init__(self) -> None:
        _require(self.kind in OBJECTIVE_SCHEMAS, "objective.kind", f"no objective is registered under this kind "
                 f"(accepted: {accepted_kinds()})", self.kind)
        own = own_kind(type(self))
        if own is not None:  # a class of its own: `objective=sft objective.kind=dpo` would run neither
            _require(self.kind == own, "objective.kind", f"objective={own} is kind {own}: choose the objective "
                     f"as an option, objective={self.kind} (accepted: {accepted_kinds()})", self.kind)


@dataclass
class SFTConfig(ObjectiveConfig):
    """objective=sft: reads no key of its own."""

    kind: str = "sft"
    """sft: cross-entropy on the loss-masked tokens (chat: the assistant turns), averaged per loss token
    over the accumulation window on all ranks (align/objectives/sft.py)."""


@dataclass
class DPOConfig(ObjectiveConfig):
    """objective=dpo: a preference loss on pairs (align/objectives/dpo.py)."""

    kind: str = "dpo"
    """dpo: a preference loss (`loss`) on pairs of a chosen and a rejected completion."""
    reads_pairs = True
    loss: str = "sigmoid"
    """sigmoid (DPO), ipo, hinge, robust, conservative (label-smoothed sigmoid), simpo and orpo (both
    reference-free); definitions in align/objectives/preference_losses.py."""
    beta: float = 0.1
    """The loss's beta (for orpo, the weight of the odds-ratio term: the paper's lambda)."""
    label_smoothing: float = 0.0
    """robust and conservative only: the assumed label-flip rate, in [0, 0.5)."""
    simpo_gamma: float = 0.0
    """simpo only: the target reward margin."""
    reference: ReferenceKind = ReferenceKind.auto
    """What the loss is measured against. model: a frozen copy of the starting policy; adapters_off: the
    LoRA base (adapters disabled, no copy); precomputed: the starting policy's log-probs computed once
    and cached on their meaning; none: no reference (simpo, orpo). auto: none for simpo/orpo,
    adapters_off with LoRA, else precomputed where the run reads at least one epoch of the pairs and
    model where it reads less."""
    reference_dtype: ReferenceDtype = ReferenceDtype.same
    """reference=model: the frozen copy's parameter dtype (bf16 halves its memory)."""
    gate_tolerance: Optional[float] = None
    """The step-0 gate's bound per target token (nats) on |batched - alone| summed log-probs and on
    |policy - reference|; null: 1e-4 in fp32, 5e-2 under bf16 autocast, and 5e-2 for the reference
    check of a bf16 frozen copy (reference_dtype=bf16) (docs/objectives.md)."""

    def __post_init__(self) -> None:
        super().__post_init__()
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

    def reference_free(self) -> bool:
        """The loss reads no reference (align/objectives/reference.py resolves none for it)."""
        from align.objectives.preference_spec import needs_reference

        return not needs_reference(self.loss)


@dataclass
class GRPOConfig(ObjectiveConfig):
    """objective=grpo: RL with verifiable rewards on prompts (`reward.weights`), align/objectives/grpo.py."""

    kind: str = "grpo"
    """grpo: groups of sampled completions per prompt, scored by the reward, each weighted by its
    advantage in its group."""
    samples_prompts = True
    reads_reward = True
    reference: ReferenceKind = ReferenceKind.auto
    """What the KL term (`kl_coef`) is measured against: model (a frozen copy of the starting policy),
    adapters_off (the LoRA base, no copy) or none; precomputed cannot cover completions that are new
    every rollout. auto: none when kl_coef is 0, else adapters_off with LoRA, else model."""
    reference_dtype: ReferenceDtype = ReferenceDtype.same
    """reference=model: the frozen copy's parameter dtype (bf16 halves its memory)."""
    group_size: int = 16
    """Completions generated per prompt (the group the advantages are relative to)."""
    prompts_per_rollout: int = 16
    """Prompts per rollout on each rank (the rollout holds prompts_per_rollout * group_size completions)."""
    updates_per_rollout: int = 1
    """Optimizer steps per rollout: the rollout is cut into this many parts, one per step, each into
    `trainer.grad_accum` micro-batches (1: on-policy)."""
    max_new_tokens: int = 4
    """Most tokens generated per completion (a stop token counts)."""
    temperature: float = 1.0
    """Sampling temperature (> 0); the loss's log-probs are of the same tempered distribution."""
    top_p: float = 1.0
    """Nucleus sampling's kept probability mass, in (0, 1]."""
    advantage: AdvantageKind = AdvantageKind.grpo
    """The advantage estimator (grpo, dr_grpo, rloo); align/objectives/advantages.py."""
    loss_agg: LossAgg = LossAgg.token_mean
    """How per-token losses are averaged over the optimizer step (align/objectives/policy_loss.py)."""
    ratio_level: RatioLevel = RatioLevel.token
    """token (PPO-style clipped ratio per token) or sequence (GSPO)."""
    clip_low: float = 0.2
    """The ratio is clipped below at 1 - clip_low."""
    clip_high: float = 0.2
    """The ratio is clipped above at 1 + clip_high (DAPO's clip-higher raises it, e.g. 0.28)."""
    kl_coef: float = 0.0
    """Weight of the per-token KL to the reference (k3 estimator); 0: no reference is used."""
    is_correction: ISCorrection = ISCorrection.none
    """none, or tis (truncated importance sampling of the trainer's over the engine's log-probs)."""
    is_cap: float = 2.0
    """is_correction=tis: the truncation of the importance weight."""
    dynamic_sampling: bool = False
    """Replace zero-variance groups (all completions scored the same) by fresh prompts' groups (DAPO's
    dynamic sampling), up to `dynamic_sampling_rounds` extra generations per rollout."""
    dynamic_sampling_rounds: int = 3
    """dynamic_sampling: extra generation rounds per rollout at most; groups still without signal after
    them are kept (their advantage is 0) and counted."""
    generation_dtype: GenerationDtype = GenerationDtype.auto
    """same: the engine generates with the training model; bf16/fp32: with a copy in that dtype,
    synced and hash-checked before every rollout (a planted train/rollout mismatch, or a cheaper engine);
    a copy needs parallel=single. auto: bf16 where the device is CUDA, parallel=single, the forward
    autocasts to bf16 (trainer.precision auto or bf16), the weights are not bf16 already (`model.dtype`)
    and LoRA is off (the copy then decodes with the numbers the policy's matmuls use anyway, and the
    policy's decoder blocks never see decode shapes, so `trainer.compile=auto` can compile them); else
    same. The manifest's `model.extra.generation.dtype` says what it resolved to and why."""
    generation_backend: Backend = Backend.auto
    """The rollout engine (align/generation): auto, align or hf. auto: align's own decode loop, except
    under sharded weights (lockstep decoding, hf). A MoE policy's router flip record reads either: align's
    engine records each token's experts beside it, hf's calls are mapped back to rows by its batching.
    The manifest's generation record (`describe()`: backend, backend_requested, backend_reason) says what
    ran and why."""
    generation_batch_size: Any = AUTO
    """Rows (prompt x completion) per call of the engine's backend: an int >= 1, or auto. auto: the
    whole rollout (prompts_per_rollout x group_size rows) in one call, capped on CUDA where the KV
    cache of that many rows at the longest prompt + max_new_tokens would not fit what the memory
    estimate leaves beside the weights, optimizer state, reference, generation copy and reward model within the
    token budget's headroom (align/plan/budget_auto.py `resolve_generation_batch_size`); on a CPU, or
    where the device's memory cannot be read, capped at 256 rows, the fixed default before auto: every
    CPU rollout keeps the calls it had. The manifest's `model.extra.generation.batch_size` says what it
    resolved to and why."""
    max_turns: int = 1
    """Assistant turns per trajectory (docs/grpo.md#tools). 1: single-turn, a completion is the model's one
    reply. Above 1: a turn that calls one of `tools` gets the result back as a `tool` message and the model
    takes another turn, up to this many; only the model's own tokens are in the loss, and the reward scores
    the last turn's text. Needs `tools`."""
    tools: list[str] = field(default_factory=list)
    """The tools a trajectory may call when `max_turns` > 1: `pkg.module:fn` or `/path/to/file.py:fn`, each
    called by its function's name, e.g. [align.rewards.calculator:calculator], the bundled arithmetic tool
    (align/rewards/tool_calls.py). Imported and checked in preflight."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require_rollout_keys(self, "must be a finite number > 0 (a group of greedy completions would all be the same)")
        _require(0 <= self.clip_low < 1, "objective.clip_low", "must be in [0, 1)", self.clip_low)
        _require(math.isfinite(self.clip_high) and self.clip_high >= 0, "objective.clip_high", "must be >= 0",
                 self.clip_high)
        _require(math.isfinite(self.kl_coef) and self.kl_coef >= 0, "objective.kl_coef", "must be >= 0", self.kl_coef)
        _require(math.isfinite(self.is_cap) and self.is_cap >= 1, "objective.is_cap", "must be >= 1", self.is_cap)
        _require(self.dynamic_sampling_rounds >= 0, "objective.dynamic_sampling_rounds", "must be >= 0",
                 self.dynamic_sampling_rounds)
        self._check_turns()
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

    def _check_turns(self) -> None:
        from align.rewards.tool_calls import tool_names

        _require(isinstance(self.max_turns, int) and self.max_turns >= 1, "objective.max_turns",
                 "must be an int >= 1 (1: single-turn)", self.max_turns)
        tool_names(self.tools)
        _require(self.max_turns == 1 or bool(self.tools), "objective.max_turns",
                 "above 1 needs objective.tools: a turn continues only after a tool call, e.g. "
                 "objective.tools=[align.rewards.calculator:calculator]", self.max_turns)
        _require(self.max_turns > 1 or not self.tools, "objective.tools",
                 "is read only when objective.max_turns > 1 (a tool's result needs a turn to answer it)",
                 list(self.tools))


def own_kind(cls: type) -> Optional[str]:
    """The objective whose schema `cls` is; None for the shared base."""
    return next((k for k, c in OBJECTIVE_SCHEMAS.items() if c is cls), None)


@dataclass
class RewardConfig:
    """The reward of RL objectives (objective=grpo): verifiers of align/rewards, your functions and a trained
    reward model, weighted and summed."""

    weights: dict[str, float] = field(default_factory=dict)
    """Verifier or function name -> weight, e.g. {gsm8k: 1.0, format: 0.1} (docs/rewards.md); each
    completion is scored against its prompt's reference. Each of `functions` is weighted by its name,
    `function` as `python`, the reward model (`path`) as `model`. Empty under objectives that read no reward."""
    function: Optional[str] = None
    """Your own reward, weighted as `python` in `weights` (reward=python): `pkg.module:fn` or
    `/path/to/file.py:fn`, a function with TRL's reward-function signature `fn(prompts, completions,
    **kwargs)` returning one number per completion (docs/rewards.md). Imported and checked in preflight."""
    functions: dict[str, str] = field(default_factory=dict)
    """Your own rewards, several: name -> `pkg.module:fn` or `/path/to/file.py:fn`, each a function like
    `function`'s and weighted by its name in `weights`, e.g. {correct: mypkg.rewards:correct} with
    weights {correct: 1.0, format: 0.1}. A name is an identifier and no verifier's (docs/rewards.md)."""
    path: Optional[str] = None
    """A trained reward model, weighted as `model` in `weights` (reward=model): a local export dir of
    objective=reward_model, or any checkpoint of a ...ForSequenceClassification class with num_labels=1 and
    a tokenizer with a chat template. Each completion's reward is its scalar for the prompt's messages and
    the completion rendered through ITS tokenizer's chat template (TRL's GRPOTrainer's rule); checked in
    preflight, loaded once on the training device (bf16 on CUDA, fp32 on a CPU), frozen (docs/rewards.md)."""
    model_batch_size: int = 32
    """`path`: completions per forward of the reward model (each rollout round's completions are scored in
    batches of this many, padded on the right)."""

    def __post_init__(self) -> None:
        b = self.model_batch_size
        _require(isinstance(b, int) and not isinstance(b, bool) and b >= 1, "reward.model_batch_size",
                 "must be an int >= 1", b)

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`)."""
        return {} if self.path is not None else {"model_batch_size": f"ignored without {key}.path (no reward model)"}
