"""Group-relative advantage estimators: one scalar per completion from the rewards of its group (the
`group_size` completions of one prompt), as pure functions of a [groups, group_size] reward tensor.

- grpo: (r - group mean) / (group std + eps), the std with Bessel's correction, eps = 1e-4: TRL 1.16's
  GRPOTrainer (`scale_rewards="group"`, its `nanstd` and `+ 1e-4`).
- dr_grpo: r - group mean (Dr. GRPO drops the std: it up-weights groups of low variance, i.e. prompts
  that are too easy or too hard).
- rloo: r - mean of the OTHER completions of the group (leave-one-out baseline), which equals
  G / (G - 1) * (r - group mean).

A group whose rewards are all equal has zero advantage under every estimator: it carries no learning
signal. `zero_variance` marks such groups (counted in the step metrics; DAPO's dynamic sampling replaces
them).

Each estimator is defined once, in `ESTIMATORS`, with what makes its advantage 0 by construction: the
least group size below which it is 0 (or undefined), and whether it is relative to a baseline from the
group (a reward that is the same for every completion then gives 0 everywhere). `advantages` computes
through that table and the config refuses through it (`no_signal`, called by align/config/root.py), so
an estimator added to `Estimator` without its entry can neither run nor be validated
(tests/unit/objectives/test_grpo_math.py enumerates them against their arithmetic). Plain Python at
import: the config layer reads this module before torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

if TYPE_CHECKING:
    import torch

STD_EPS = 1e-4
"""Added to the group std before dividing (TRL's constant): a group of equal rewards gives 0 / eps = 0."""


class Estimator(StrEnum):
    """`objective.advantage` (align/config/objective.py names it AdvantageKind)."""

    grpo = "grpo"
    """(r - group mean) / (group std + 1e-4), the std with Bessel's correction (TRL's default)."""
    dr_grpo = "dr_grpo"
    """r - group mean (Dr. GRPO: no std, so easy and hard prompts are not up-weighted)."""
    rloo = "rloo"
    """r - mean of the other completions of the group (leave-one-out)."""


@dataclass(frozen=True)
class Definition:
    compute: Callable[["torch.Tensor"], "torch.Tensor"]
    """[groups, G] rewards -> [groups, G] advantages, for G >= `min_group_size`."""
    min_group_size: int
    """The least group size whose advantages are not identically 0 (or undefined)."""
    below: str
    """Why a smaller group gives none: the refusal's reason."""
    group_baseline: bool
    """The advantage is relative to a baseline computed from the group's rewards: adding one constant to
    every reward changes nothing, so a reward that is the same for every completion gives 0 everywhere."""


def _grpo(rewards: "torch.Tensor") -> "torch.Tensor":
    return (rewards - rewards.mean(dim=1, keepdim=True)) / (rewards.std(dim=1, keepdim=True) + STD_EPS)


def _dr_grpo(rewards: "torch.Tensor") -> "torch.Tensor":
    return rewards - rewards.mean(dim=1, keepdim=True)


def _rloo(rewards: "torch.Tensor") -> "torch.Tensor":
    others = (rewards.sum(dim=1, keepdim=True) - rewards) / (rewards.shape[1] - 1)
    return rewards - others


ESTIMATORS: Mapping[Estimator, Definition] = MappingProxyType({
    Estimator.grpo: Definition(_grpo, 2, "a completion alone is its group's mean (r - mean = 0) and one sample has "
                               "no std (Bessel's correction divides by 0)", group_baseline=True),
    Estimator.dr_grpo: Definition(_dr_grpo, 2, "a completion alone is its group's mean: r - mean = 0",
                                  group_baseline=True),
    Estimator.rloo: Definition(_rloo, 2, "a completion alone has no other completion to average as its baseline",
                               group_baseline=True),
})


def definition(estimator: Estimator | str) -> Definition:
    """The estimator's entry of `ESTIMATORS`; an estimator without one is a programming error."""
    e = Estimator(estimator)
    if e not in ESTIMATORS:
        raise NotImplementedError(f"advantage estimator {e.value} has no entry in ESTIMATORS "
                                  "(align/objectives/advantages.py): its rules of no signal are not known")
    return ESTIMATORS[e]


def no_signal(estimator: Estimator | str, group_size: int, constant_reward: Optional[float],
              reward_weights: Optional[Mapping[str, float]] = None) -> Optional[tuple[str, str, Any]]:
    """Why every advantage of this composition is 0 by construction, as (key, message, value) for a
    refusal naming the key, or None. `constant_reward`: the one reward every completion gets where the
    reward's config fixes it (`WeightedReward.constant`), else None; `reward_weights` is shown with it."""
    e = Estimator(estimator)
    d = definition(e)
    if group_size < d.min_group_size:
        return ("objective.group_size", f"advantage={e.value} needs >= {d.min_group_size} completions per prompt: "
                f"{d.below}, so every advantage would be 0 and nothing would train", group_size)
    if constant_reward is not None and (d.group_baseline or constant_reward == 0):
        return ("reward.weights", f"every completion scores {constant_reward:g} whatever it says (each verifier is "
                "weighted 0 or gives one value only, each function and the reward model weighted 0), so every "
                f"advantage under advantage={e.value} would be 0 and nothing would train: weight a verifier whose "
                "score varies, a function or a reward model",
                None if reward_weights is None else dict(reward_weights))
    return None


def advantages(rewards: "torch.Tensor", estimator: Estimator | str) -> "torch.Tensor":
    """Advantages [groups, G] (float64 in, float64 out when given float64) from rewards [groups, G]."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, group_size], got shape {tuple(rewards.shape)}")
    e = Estimator(estimator)
    d = definition(e)
    if rewards.shape[1] < d.min_group_size:
        raise ValueError(f"{e.value} advantages need group_size >= {d.min_group_size} ({d.below})")
    return d.compute(rewards)


def zero_variance(rewards: "torch.Tensor") -> "torch.Tensor":
    """[groups] bool: every completion of the group got the same reward."""
    return (rewards == rewards[:, :1]).all(dim=1)
