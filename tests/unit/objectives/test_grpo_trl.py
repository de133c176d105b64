"""GRPO's policy loss against TRL 1.16's own GRPOTrainer._compute_loss (values and gradients), where TRL
is installed (the test extra). The trainer is built with object.__new__ and given only the attributes
its loss code reads; its forward is replaced by per-token log-probs we choose, so both sides see the
same numbers. TRL's loss types map onto our aggregations:

    TRL "grpo" (per-sequence token mean, mean over sequences)  = seq_mean_token_mean
    TRL "bnpo" and "dapo" (token mean over the batch)          = token_mean
    TRL "dr_grpo" (token sum / (sequences x max length))       = seq_mean_token_sum / max_completion_length
    importance_sampling_level "sequence"                       = ratio_level=sequence (GSPO)
    beta (k3 KL to ref_per_token_logps)                        = kl_coef
    vLLM's truncated importance_sampling_ratio                 = is_correction=tis's weight
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from align.objectives.policy_loss import Aggregation, LossSpec, RatioLevel, policy_loss

B, T, MAX_LEN = 6, 5, 7
LENS = torch.tensor([5, 2, 4, 1, 3, 5])
TRL_TYPES = {"grpo": Aggregation.seq_mean_token_mean, "bnpo": Aggregation.token_mean,
             "dapo": Aggregation.token_mean, "dr_grpo": Aggregation.seq_mean_token_sum}


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None, :] < LENS[:, None]).long()
    old = -torch.rand(B, T, generator=g) * 3
    logp = old + torch.randn(B, T, generator=g) * 0.4
    ref = old + torch.randn(B, T, generator=g) * 0.3
    adv = torch.tensor([1.5, -0.7, 0.3, -1.2, 0.9, -0.1])
    isw = (torch.rand(B, T, generator=g) * 2.5).clamp(max=2.0)
    return mask, logp, old, ref, adv, isw


def _trl_loss(loss_type: str, level: str, beta: float, logp: torch.Tensor, mask, old, ref, adv, isw) -> torch.Tensor:
    from trl.trainer.grpo_trainer import GRPOTrainer

    trainer = object.__new__(GRPOTrainer)
    accelerator = SimpleNamespace(num_processes=1, sync_gradients=True, gather=lambda t: t,
                                  gather_for_metrics=lambda t: t, reduce=lambda t, reduction="sum": t)
    trainer.__dict__.update(
        model=SimpleNamespace(training=True), accelerator=accelerator, aux_loss_enabled=False, top_entropy_quantile=1.0,
        off_policy_mask_threshold=None, importance_sampling_level=level, beta=beta, loss_type=loss_type,
        epsilon_low=0.2, epsilon_high=0.28, use_vllm=isw is not None,
        vllm_importance_sampling_correction=isw is not None,
        current_gradient_accumulation_steps=1, max_completion_length=MAX_LEN, _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list)},
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
    )
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask, "advantages": adv,
              "old_per_token_logps": old, "num_items_in_batch": mask.sum()}
    if beta:
        inputs["ref_per_token_logps"] = ref
    if isw is not None:
        inputs["importance_sampling_ratio"] = isw
    return trainer._compute_loss(None, inputs)


def _our_loss(agg: Aggregation, level: str, beta: float, logp: torch.Tensor, mask, old, ref, adv, isw) -> torch.Tensor:
    keep = mask.bool()
    seq = torch.arange(B)[:, None].expand(B, T)[keep]
    spec = LossSpec(clip_low=0.2, clip_high=0.28, level=RatioLevel(level), aggregation=agg, kl_coef=beta)
    out = policy_loss(logp[keep], old[keep], adv[seq], seq, B, spec, ref=ref[keep],
                      is_weight=None if isw is None else isw[keep])
    return out.total / out.units


CASES = [(t, lv, beta, tis) for t in TRL_TYPES for lv in ("token", "sequence") for beta in (0.0, 0.04)
         for tis in (False, True)]


@pytest.mark.parametrize("loss_type,level,beta,tis", CASES,
                         ids=[f"{t}-{lv}-beta{b}-{'tis' if w else 'plain'}" for t, lv, b, w in CASES])
def test_matches_trl_grpo_trainer(loss_type, level, beta, tis):
    pytest.importorskip("trl", reason="TRL (the test extra) is not installed: no parity check against it")
    mask, logp0, old, ref, adv, isw = _inputs()
    isw = isw if tis else None
    results = {}
    for side in ("align", "trl"):
        logp = logp0.clone().requires_grad_()
        if side == "trl":
            loss = _trl_loss(loss_type, level, beta, logp, mask, old, ref, adv, isw)
        else:
            loss = _our_loss(TRL_TYPES[loss_type], level, beta, logp, mask, old, ref, adv, isw)
            if loss_type == "dr_grpo":  # TRL divides the token sums by the max completion length, not by 1
                loss = loss / MAX_LEN
        (grad,) = torch.autograd.grad(loss, logp)
        results[side] = (loss.detach(), grad * mask)  # padding positions carry no gradient on either side
    torch.testing.assert_close(results["align"][0], results["trl"][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results["align"][1], results["trl"][1], rtol=1e-5, atol=1e-6)


def test_the_parity_batch_can_tell_the_conventions_apart():
    """Each mapping must be the only one that matches: token mean and sequence mean differ here, and
    clipping is active, so a swapped aggregation or a missing clip would fail the parity test."""
    mask, logp, old, ref, adv, _ = _inputs()
    a = _our_loss(Aggregation.token_mean, "token", 0.0, logp, mask, old, ref, adv, None)
    b = _our_loss(Aggregation.seq_mean_token_mean, "token", 0.0, logp, mask, old, ref, adv, None)
    c = _our_loss(Aggregation.token_mean, "sequence", 0.0, logp, mask, old, ref, adv, None)
    assert abs(a - b) > 1e-3 and abs(a - c) > 1e-3
    ratio = torch.exp(logp - old)[mask.bool()]
    assert ((ratio > 1.28) | (ratio < 0.8)).any()
