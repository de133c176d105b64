"""Preference-optimisation losses on per-sequence log-probs: the math only, no model and no data.

Inputs (`PairLogps`), per pair of a micro-batch, as 1-D tensors of one length P:
- the policy's log-probs of the chosen and the rejected response, each the SUM of that response's
  token log-probs, and each response's token count, so that the losses that normalise by length
  (ipo, simpo, orpo) can;
- the reference model's sums, for the reference-based losses; None for simpo and orpo;
- for orpo, its SFT term: the chosen sequence's summed NLL and the number of tokens it covers.

Normalisation: `PreferenceLossOutput.losses` holds one loss per pair. The objective sums them over the
micro-batches of an accumulation window and divides by the window's global pair count (all ranks), so
what is optimised is the mean over the window's pairs however the window was cut into micro-batches.
`metric_sums` follows the same rule: sums, to be reduced and divided by that same count.

With pc, pr the policy sums, rc, rr the reference sums, nc, nr the token counts, d = (pc - rc) - (pr - rr),
a_x = x / n_x the per-token average, ls the log-sigmoid, b = beta and e = label_smoothing:

    loss          per-pair loss                                              reward of a side
    sigmoid       -ls(b d)                                                   b (p - r)
    hinge         max(0, 1 - b d)                                            b (p - r)
    ipo           (d_avg - 1 / (2 b))^2,  d_avg = (pc - rc)/nc - (pr - rr)/nr   b (p - r)
    conservative  -(1 - e) ls(b d) - e ls(-b d)                              b (p - r)
    robust        (-(1 - e) ls(b d) + e ls(-b d)) / (1 - 2 e)                b (p - r)
    simpo         -ls(b (a_pc - a_pr) - gamma)                               b a_p
    orpo          nll / n_nll - b ls(lo(a_pc) - lo(a_pr)),  lo(a) = a - log(1 - e^a)   b a_p

These are TRL 1.16's definitions (DPOTrainer: sigmoid, hinge, ipo, robust; CPOTrainer: the
label-smoothed sigmoid and simpo; ORPOTrainer: orpo), tested against it in
tests/unit/objectives/test_preference_losses.py. Conventions to know when comparing:
- ipo averages the log-ratios over response tokens (TRL does, with the IPO authors' agreement); its
  reported rewards are still b times the summed log-ratio, as for the other reference-based losses.
- hinge puts the margin 1 on b d, i.e. a margin of 1/b on d.
- robust is the unbiased estimator for labels flipped with probability e, hence the 1 - 2 e.
- conservative: TRL 1.16's DPOTrainer no longer smooths its sigmoid (it ignores label_smoothing);
  the formula is CPOTrainer's label-smoothed sigmoid, applied here to the log-ratio difference d.
- simpo: gamma is the target margin on the reward scale (TRL's `simpo_gamma`; SimPO's own code takes
  gamma / b, "gamma_beta_ratio"). This is SimPO proper: no SFT term (TRL's `cpo_alpha=0`).
- orpo: b is the ORPO paper's lambda (TRL's `beta`). The SFT term here is a per-pair token mean, so
  every pair weighs the same; TRL's is one token mean over all chosen sequences of the micro-batch
  (prompt included): the two agree when every pair covers as many NLL tokens.
- `logps/chosen` and `logps/rejected` are summed log-probs for every loss (TRL logs averages for simpo
  and orpo); accuracy is chosen reward > rejected reward, strictly, as in TRL.

Inputs below fp32 (bf16 from the model) are computed in fp32: d is a small difference of large sums.
Token counts must be >= 1. That is not checked here (a check on tensor values would synchronise the
device on every micro-batch): the data side refuses empty responses, and a zero count gives a
non-finite loss, which the trainer's non-finite halt stops on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from align.objectives.preference_spec import REFERENCE_FREE, PreferenceLoss, check_hyperparameters


@dataclass(frozen=True)
class PairLogps:
    """One micro-batch of pairs; every field is a 1-D tensor of the same length (one entry per pair)."""

    policy_chosen: torch.Tensor
    """Policy: sum of the chosen response's token log-probs."""
    policy_rejected: torch.Tensor
    """Policy: sum of the rejected response's token log-probs."""
    chosen_tokens: torch.Tensor
    """Number of tokens in the chosen response (>= 1)."""
    rejected_tokens: torch.Tensor
    """Number of tokens in the rejected response (>= 1)."""
    reference_chosen: Optional[torch.Tensor] = None
    """Reference model: sum of the chosen response's token log-probs (reference-based losses only)."""
    reference_rejected: Optional[torch.Tensor] = None
    """Reference model: sum of the rejected response's token log-probs (reference-based losses only)."""
    chosen_nll: Optional[torch.Tensor] = None
    """orpo only: summed NLL of the chosen sequence over the tokens its SFT term covers (-policy_chosen when
    that is the response alone)."""
    chosen_nll_tokens: Optional[torch.Tensor] = None
    """orpo only: number of tokens chosen_nll covers (>= 1)."""


@dataclass(frozen=True)
class PreferenceLossOutput:
    losses: torch.Tensor
    """Per-pair loss, differentiable; the objective sums it and divides by the window's global pair count."""
    chosen_rewards: torch.Tensor
    """Per-pair reward of the chosen response, in the loss's own definition (module docstring); detached."""
    rejected_rewards: torch.Tensor
    """Per-pair reward of the rejected response; detached."""
    chosen_logps: torch.Tensor
    """Policy's summed log-prob of the chosen response; detached."""
    rejected_logps: torch.Tensor
    """Policy's summed log-prob of the rejected response; detached."""
    chosen_nll: Optional[torch.Tensor] = None
    """orpo only: the per-pair SFT term (token-mean NLL of chosen); detached."""

    def metric_sums(self, truncated: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-metric sums over this micro-batch's pairs (0-d fp32 tensors, no device sync), to be summed
        over the window and all ranks and divided by the global pair count. `truncated`: per pair, whether
        either side was cut to fit the sequence length."""
        if truncated.shape != self.losses.shape:
            raise ValueError(f"truncated: shape {tuple(truncated.shape)} differs from the pairs' "
                             f"{tuple(self.losses.shape)}")
        margin = self.chosen_rewards - self.rejected_rewards
        per_pair = {
            "loss": self.losses.detach(),
            "rewards/chosen": self.chosen_rewards,
            "rewards/rejected": self.rejected_rewards,
            "rewards/margin": margin,
            "rewards/accuracy": (margin > 0),
            "logps/chosen": self.chosen_logps,
            "logps/rejected": self.rejected_logps,
            "truncated_fraction": truncated.bool(),
        }
        if self.chosen_nll is not None:
            per_pair["nll/chosen"] = self.chosen_nll
        return {name: v.to(torch.float32).sum() for name, v in per_pair.items()}


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    if not t.is_floating_point():
        raise ValueError(f"policy_chosen: log-probs must be a floating tensor (got {t.dtype})")
    return torch.promote_types(t.dtype, torch.float32)


def _check_inputs(kind: PreferenceLoss, x: PairLogps) -> None:
    if x.policy_chosen.dim() != 1:
        raise ValueError(f"policy_chosen: must be 1-D, one entry per pair (got shape {tuple(x.policy_chosen.shape)})")
    shape = x.policy_chosen.shape
    has_ref = x.reference_chosen is not None or x.reference_rejected is not None
    if kind in REFERENCE_FREE and has_ref:
        raise ValueError(f"reference_chosen/reference_rejected: loss={kind.value} is reference-free; pass None")
    if kind not in REFERENCE_FREE and (x.reference_chosen is None or x.reference_rejected is None):
        raise ValueError(f"reference_chosen/reference_rejected: loss={kind.value} needs the reference model's "
                         "log-probs of both sides (only simpo and orpo are reference-free)")
    has_nll = x.chosen_nll is not None or x.chosen_nll_tokens is not None
    if kind is PreferenceLoss.orpo and (x.chosen_nll is None or x.chosen_nll_tokens is None):
        raise ValueError("chosen_nll/chosen_nll_tokens: loss=orpo needs its SFT term (the chosen sequence's summed "
                         "NLL and its token count)")
    if kind is not PreferenceLoss.orpo and has_nll:
        raise ValueError(f"chosen_nll/chosen_nll_tokens: only orpo has an SFT term; loss={kind.value} would ignore it")
    for name in ("policy_rejected", "chosen_tokens", "rejected_tokens", "reference_chosen", "reference_rejected",
                 "chosen_nll", "chosen_nll_tokens"):
        t = getattr(x, name)
        if t is not None and t.shape != shape:
            raise ValueError(f"{name}: shape {tuple(t.shape)} differs from policy_chosen's {tuple(shape)}")


def _log1mexp(a: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(a)) for a < 0, to full precision on both sides of -log 2 (Maechler 2012): near 0, where
    1 - exp(a) cancels and a confident model's average log-prob lives, through expm1."""
    return torch.where(a > -math.log(2), torch.log(-torch.expm1(a)), torch.log1p(-torch.exp(a)))


@dataclass(frozen=True)
class _Terms:
    """What the loss formulas read, already in the compute dtype; the references are None for the reference-free
    losses."""

    b: float
    eps: float
    gamma: float
    pc: torch.Tensor
    pr: torch.Tensor
    nc: torch.Tensor
    nr: torch.Tensor
    rc: Optional[torch.Tensor]
    rr: Optional[torch.Tensor]

    @property
    def z(self) -> torch.Tensor:
        return self.b * ((self.pc - self.rc) - (self.pr - self.rr))


def _sigmoid(t: _Terms) -> torch.Tensor:
    return -F.logsigmoid(t.z)


def _hinge(t: _Terms) -> torch.Tensor:
    return torch.relu(1 - t.z)


def _ipo(t: _Terms) -> torch.Tensor:
    return ((t.pc - t.rc) / t.nc - (t.pr - t.rr) / t.nr - 1 / (2 * t.b)) ** 2


def _conservative(t: _Terms) -> torch.Tensor:
    z = t.z
    return -(1 - t.eps) * F.logsigmoid(z) - t.eps * F.logsigmoid(-z)


def _robust(t: _Terms) -> torch.Tensor:
    z = t.z
    return (-(1 - t.eps) * F.logsigmoid(z) + t.eps * F.logsigmoid(-z)) / (1 - 2 * t.eps)


def _simpo(t: _Terms) -> torch.Tensor:
    return -F.logsigmoid(t.b * (t.pc / t.nc - t.pr / t.nr) - t.gamma)


def _orpo_odds_term(t: _Terms) -> torch.Tensor:
    ac, ar = t.pc / t.nc, t.pr / t.nr
    log_odds = (ac - ar) - (_log1mexp(ac) - _log1mexp(ar))
    return -t.b * F.logsigmoid(log_odds)


_LOSSES = {
    PreferenceLoss.sigmoid: _sigmoid,
    PreferenceLoss.ipo: _ipo,
    PreferenceLoss.hinge: _hinge,
    PreferenceLoss.robust: _robust,
    PreferenceLoss.conservative: _conservative,
    PreferenceLoss.simpo: _simpo,
    PreferenceLoss.orpo: _orpo_odds_term,
}


def preference_loss(loss: PreferenceLoss | str, x: PairLogps, *, beta: float, label_smoothing: float = 0.0,
                    simpo_gamma: float = 0.0) -> PreferenceLossOutput:
    """Per-pair losses, rewards and log-probs of one micro-batch (module docstring for the definitions)."""
    kind = check_hyperparameters(loss, beta=beta, label_smoothing=label_smoothing, simpo_gamma=simpo_gamma)
    _check_inputs(kind, x)
    dtype = _compute_dtype(x.policy_chosen)

    def cast(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return None if t is None else t.to(dtype)

    pc, pr, nc, nr = cast(x.policy_chosen), cast(x.policy_rejected), cast(x.chosen_tokens), cast(x.rejected_tokens)
    rc, rr = cast(x.reference_chosen), cast(x.reference_rejected)
    losses = _LOSSES[kind](_Terms(float(beta), float(label_smoothing), float(simpo_gamma), pc, pr, nc, nr, rc, rr))
    nll = None
    if kind is PreferenceLoss.orpo:
        nll = cast(x.chosen_nll) / cast(x.chosen_nll_tokens)
        losses = nll + losses
    with torch.no_grad():
        if kind in REFERENCE_FREE:
            chosen_rewards, rejected_rewards = beta * pc / nc, beta * pr / nr
        else:
            chosen_rewards, rejected_rewards = beta * (pc - rc), beta * (pr - rr)
    return PreferenceLossOutput(losses=losses, chosen_rewards=chosen_rewards, rejected_rewards=rejected_rewards,
                                chosen_logps=pc.detach(), rejected_logps=pr.detach(),
                                chosen_nll=None if nll is None else nll.detach())
