"""The KTO loss on per-sequence log-probs: the math only, no model and no data.

Inputs (`KTOLogps`), per example of a micro-batch, as 1-D tensors of one length N: the policy's and the
reference's summed log-prob of the example's completion, the same two of its KL sequence (its prompt
with another example's completion, align/data/unpaired.py), and its label (True: desirable).

With r = policy - reference the completion's log-ratio, b = beta, s the sigmoid and z the KL reference
point of the micro-batch:

    z = max(0, mean over the micro-batch's KL sequences of (policy_kl - reference_kl)), no gradient
    desirable:    desirable_weight   * (1 - s(b (r - z)))
    undesirable:  undesirable_weight * (1 - s(b (z - r)))
    reward:       b r

This is TRL 1.16's KTOTrainer with loss_type="kto" (`_compute_loss`: the KL mean is detached, averaged
over processes and clamped at 0; tested against it in tests/unit/objectives/test_kto_loss.py). Its
loss_type="apo_zero_unpaired" is the same with z = 0: desirable 1 - s(b r), undesirable s(b r) (which
is 1 - s(b (0 - r))), each times its weight; TRL computes no KL point for it, and here `z` is then the
estimate reported beside the loss, not read by it. Under data
parallelism `reduce` averages the per-rank means as TRL's gather does. TRL averages the losses of its
batch (`nanmean`); here `KTOLossOutput.losses` holds one loss per example, which the objective sums and
divides by the window's global example count: the same as TRL's where a window is one micro-batch on one
rank. Inputs below fp32 are computed in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

LOSSES = ("kto", "apo_zero_unpaired")
"""TRL's KTOConfig.loss_type values, as align/config/kto_config.py `KTOLoss` names them."""


@dataclass(frozen=True)
class KTOLogps:
    """One micro-batch of examples; every field is a 1-D tensor of the same length (one entry per example)."""

    policy: torch.Tensor
    """Policy: sum of the completion's token log-probs."""
    reference: torch.Tensor
    """Reference: the same sum."""
    policy_kl: torch.Tensor
    """Policy: sum of the KL sequence's completion token log-probs (another example's completion)."""
    reference_kl: torch.Tensor
    """Reference: the same sum."""
    desirable: torch.Tensor
    """bool: the completion is desirable."""


@dataclass(frozen=True)
class KTOLossOutput:
    losses: torch.Tensor
    """Per-example weighted loss, differentiable."""
    rewards: torch.Tensor
    """Per-example reward, beta times the log-ratio; detached."""
    logps: torch.Tensor
    """Policy's summed log-prob of each completion; detached."""
    kl: torch.Tensor
    """The micro-batch's KL estimate (0-d, detached, >= 0): kto's reference point; apo_zero_unpaired's
    loss does not read it."""
    desirable: torch.Tensor
    """bool per example."""

    def metric_sums(self, truncated: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-metric sums over this micro-batch (0-d fp32 tensors, no device sync): the chosen/rejected
        ones with their example counts (`n/chosen`, `n/rejected`), to be divided by them once summed over
        the window and the ranks; `kl` with `n/kl`, one per micro-batch."""
        d = self.desirable
        f = torch.float32
        return {"loss": self.losses.detach().to(f).sum(), "kl": self.kl.to(f), "n/kl": torch.ones((), device=d.device),
                "n/chosen": d.to(f).sum(), "n/rejected": (~d).to(f).sum(),
                "rewards/chosen": self.rewards[d].to(f).sum(), "rewards/rejected": self.rewards[~d].to(f).sum(),
                "logps/chosen": self.logps[d].to(f).sum(), "logps/rejected": self.logps[~d].to(f).sum(),
                "truncated_fraction": truncated.to(f).sum()}


def kl_reference_point(policy_kl: torch.Tensor, reference_kl: torch.Tensor,
                       reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> torch.Tensor:
    """z of the module doc: the detached mean log-ratio of the KL sequences, averaged over ranks by
    `reduce` (None: this micro-batch alone), clamped at 0."""
    kl = (policy_kl.to(torch.float32) - reference_kl.to(torch.float32)).mean().detach()
    if reduce is not None:
        kl = reduce(kl)
    return kl.clamp(min=0)


def kto_loss(x: KTOLogps, kl: torch.Tensor, *, beta: float, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0, loss: str = "kto") -> KTOLossOutput:
    """Per-example losses, rewards and log-probs of one micro-batch against the KL reference point `kl`
    (`loss` "kto"), or against 0 (`loss` "apo_zero_unpaired", where `kl` is only reported)."""
    if loss not in LOSSES:
        raise ValueError(f"loss: {loss!r}; accepted: {', '.join(LOSSES)}")
    if x.policy.dim() != 1:
        raise ValueError(f"policy: must be 1-D, one entry per example (got shape {tuple(x.policy.shape)})")
    for name in ("reference", "policy_kl", "reference_kl", "desirable"):
        if getattr(x, name).shape != x.policy.shape:
            raise ValueError(f"{name}: shape {tuple(getattr(x, name).shape)} differs from policy's "
                             f"{tuple(x.policy.shape)}")
    dtype = torch.promote_types(x.policy.dtype, torch.float32)
    ratio = x.policy.to(dtype) - x.reference.to(dtype)
    z = kl.to(dtype)
    point = z if loss == "kto" else torch.zeros_like(z)
    desirable = x.desirable.bool()
    chosen = desirable_weight * (1 - torch.sigmoid(beta * (ratio - point)))
    rejected = undesirable_weight * (1 - torch.sigmoid(beta * (point - ratio)))
    return KTOLossOutput(losses=torch.where(desirable, chosen, rejected), rewards=(beta * ratio).detach(),
                         logps=x.policy.detach(), kl=z.detach(), desirable=desirable)
