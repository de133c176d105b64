"""The GRPO policy loss as pure functions of per-token tensors (flat over one micro-batch's targets).

Per target token t of completion i, with advantage A_i:

- ratio, `level=token` (PPO, GRPO): r_t = exp(logp_t - old_t); `level=sequence` (GSPO): every token of
  completion i gets s_i = exp(mean over i's tokens of (logp - old)), one ratio per sequence;
- clipped surrogate: l_t = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A);
- truncated importance sampling (`is_weight`, TIS): l_t *= w_t, w_t = min(exp(old_t - engine_t), cap),
  detached: the trainer's log-prob over the engine's for the token the engine sampled;
- KL to a reference, k3 estimator: kl_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1 (>= 0, unbiased
  for KL(policy || reference) under samples from the policy); l_t += kl_coef * kl_t.

This is TRL 1.16's GRPOTrainer._compute_loss term for term (tests/unit/objectives/test_grpo_trl.py).

Aggregation (`Aggregation`) returns the SUM over loss units and their count: the trainer divides the
window's sum by the window's global unit count, so a window cut into micro-batches any way (and over any
number of ranks) gives the same loss as one batch:

- token_mean: units are target tokens: sum_t l_t / N (TRL's "bnpo"; "dapo" over a whole window);
- seq_mean_token_mean: units are completions: sum_i (sum_{t in i} l_t / n_i) / S (TRL's "grpo");
- seq_mean_token_sum: units are completions: sum_i sum_{t in i} l_t / S (Dr. GRPO up to the constant
  TRL's "dr_grpo" divides by instead of S: the max completion length).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Optional

import torch


class RatioLevel(StrEnum):
    token = "token"
    sequence = "sequence"


class Aggregation(StrEnum):
    token_mean = "token_mean"
    seq_mean_token_mean = "seq_mean_token_mean"
    seq_mean_token_sum = "seq_mean_token_sum"


@dataclass(frozen=True)
class LossSpec:
    clip_low: float = 0.2
    clip_high: float = 0.2
    level: RatioLevel = RatioLevel.token
    aggregation: Aggregation = Aggregation.token_mean
    kl_coef: float = 0.0


@dataclass
class PolicyLoss:
    total: torch.Tensor
    """Sum of the loss over this micro-batch's units (scalar, with grad)."""
    units: int
    """Loss units in it (tokens for token_mean, completions otherwise)."""
    sums: dict[str, torch.Tensor]
    """Per-token metric sums (detached): clipped, ratio, kl; divide by `tokens` for means."""
    tokens: int


def seq_means(values: torch.Tensor, seq: torch.Tensor, n_seq: int) -> torch.Tensor:
    """[n_seq] mean of `values` over each sequence's tokens (`seq` names each token's sequence)."""
    sums = values.new_zeros(n_seq).index_add_(0, seq, values)
    counts = torch.bincount(seq, minlength=n_seq).to(values.dtype)
    return sums / counts.clamp(min=1)


def ratios(logp: torch.Tensor, old: torch.Tensor, seq: torch.Tensor, n_seq: int, level: RatioLevel) -> torch.Tensor:
    """Per-token importance ratio of the current policy over the rollout's (`old`)."""
    log_ratio = logp - old
    if RatioLevel(level) == RatioLevel.sequence:
        log_ratio = seq_means(log_ratio, seq, n_seq).index_select(0, seq)
    return torch.exp(log_ratio)


def k3(logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    d = ref - logp
    return torch.exp(d) - d - 1


def per_token_loss(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, seq: torch.Tensor, n_seq: int,
                   spec: LossSpec, ref: Optional[torch.Tensor] = None,
                   is_weight: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(l_t [N], detached per-token metrics) for targets with log-probs `logp` (grad), rollout log-probs
    `old`, per-token advantages `adv`, sequence ids `seq` in [0, n_seq)."""
    r = ratios(logp, old, seq, n_seq, spec.level)
    clipped = torch.clamp(r, 1 - spec.clip_low, 1 + spec.clip_high)
    loss = -torch.min(r * adv, clipped * adv)
    if is_weight is not None:
        loss = loss * is_weight.detach()
    metrics = {"ratio": r.detach(), "clipped": (r * adv > clipped * adv).to(r.dtype).detach()}
    if spec.kl_coef:
        if ref is None:
            raise ValueError("kl_coef > 0 needs the reference's log-probs")
        kl = k3(logp, ref)
        loss = loss + spec.kl_coef * kl
        metrics["kl"] = kl.detach()
    return loss, metrics


def aggregate(loss: torch.Tensor, seq: torch.Tensor, n_seq: int, how: Aggregation) -> tuple[torch.Tensor, int]:
    """(sum over units, unit count) of per-token losses `loss` under aggregation `how`."""
    how = Aggregation(how)
    if how == Aggregation.token_mean:
        return loss.sum(), int(loss.numel())
    if how == Aggregation.seq_mean_token_mean:
        return seq_means(loss, seq, n_seq).sum(), n_seq
    return loss.sum(), n_seq


def policy_loss(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, seq: torch.Tensor, n_seq: int,
                spec: LossSpec, ref: Optional[torch.Tensor] = None,
                is_weight: Optional[torch.Tensor] = None) -> PolicyLoss:
    loss, metrics = per_token_loss(logp, old, adv, seq, n_seq, spec, ref, is_weight)
    total, units = aggregate(loss, seq, n_seq, spec.aggregation)
    return PolicyLoss(total=total, units=units, sums={k: v.sum() for k, v in metrics.items()}, tokens=int(loss.numel()))
