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
"""

from __future__ import annotations

from enum import StrEnum

import torch

STD_EPS = 1e-4
"""Added to the group std before dividing (TRL's constant): a group of equal rewards gives 0 / eps = 0."""


class Estimator(StrEnum):
    grpo = "grpo"
    dr_grpo = "dr_grpo"
    rloo = "rloo"


def advantages(rewards: torch.Tensor, estimator: Estimator | str) -> torch.Tensor:
    """Advantages [groups, G] (float64 in, float64 out when given float64) from rewards [groups, G]."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, group_size], got shape {tuple(rewards.shape)}")
    g = rewards.shape[1]
    mean = rewards.mean(dim=1, keepdim=True)
    estimator = Estimator(estimator)
    if estimator == Estimator.grpo:
        if g < 2:
            raise ValueError("grpo advantages need group_size >= 2 (a std of one sample is undefined)")
        return (rewards - mean) / (rewards.std(dim=1, keepdim=True) + STD_EPS)
    if estimator == Estimator.dr_grpo:
        return rewards - mean
    if g < 2:
        raise ValueError("rloo advantages need group_size >= 2 (no other sample to leave in)")
    others = (rewards.sum(dim=1, keepdim=True) - rewards) / (g - 1)
    return rewards - others


def zero_variance(rewards: torch.Tensor) -> torch.Tensor:
    """[groups] bool: every completion of the group got the same reward."""
    return (rewards == rewards[:, :1]).all(dim=1)
