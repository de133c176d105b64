"""The reward model's loss (objective=reward_model), TRL 1.16's `RewardTrainer.compute_loss` per pair.

TRL, on a batch of pairs with rewards r_c, r_r: mean(-logsigmoid(r_c - r_r [- margin])), plus
center_rewards_coefficient x mean((r_c + r_r)^2) when that coefficient is set. Both are means over the
same pairs, so the per-pair loss below, averaged over a batch, is TRL's loss on it; the loop divides the
summed losses by the window's global pair count (align/objectives/interface.py), i.e. the mean over the
window. tests/unit/objectives/test_reward_model.py holds it to TRL's own code.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def bradley_terry_losses(chosen: torch.Tensor, rejected: torch.Tensor, margin: Optional[torch.Tensor] = None,
                         center_rewards_coefficient: Optional[float] = None) -> torch.Tensor:
    """[P] per-pair losses of the rewards `chosen`, `rejected` [P] (and a per-pair `margin`, if any)."""
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin
    losses = -F.logsigmoid(diff)
    if center_rewards_coefficient is not None:
        losses = losses + center_rewards_coefficient * (chosen + rejected) ** 2
    return losses


def independent_losses(chosen: torch.Tensor, rejected: torch.Tensor, margin: Optional[torch.Tensor],
                       center_rewards_coefficient: Optional[float]) -> torch.Tensor:
    """The same losses by another formula, in float64 (the step-0 gate's check of the loss that runs):
    log(1 + exp(-(r_c - r_r - m))) + c x (r_c + r_r)^2."""
    c, r = chosen.detach().double(), rejected.detach().double()
    m = torch.zeros_like(c) if margin is None else margin.detach().double().to(c.device)
    return torch.log1p(torch.exp(-(c - r - m))) + (center_rewards_coefficient or 0.0) * (c + r) ** 2
