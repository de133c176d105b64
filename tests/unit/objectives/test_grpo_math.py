"""GRPO's advantages and policy loss against naive per-sample arithmetic in float64: Python loops over
groups, sequences and tokens, written from the definitions (align/objectives/advantages.py,
align/objectives/policy_loss.py docstrings), never through the code under test."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from align.objectives.advantages import STD_EPS, Estimator, advantages, no_signal, zero_variance
from align.objectives.policy_loss import Aggregation, LossSpec, RatioLevel, policy_loss

G = 5


def _rewards() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    r = torch.rand(4, G, generator=g, dtype=torch.float64)
    r[1] = 0.5  # a zero-variance group
    r[2] = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64)  # binary rewards, as a verifier gives
    return r


def _naive_advantages(rewards: torch.Tensor, kind: Estimator) -> list[list[float]]:
    out = []
    for group in rewards.tolist():
        mean = sum(group) / len(group)
        if kind == Estimator.grpo:
            sd = statistics.stdev(group)  # Bessel-corrected, like TRL's nanstd
            out.append([(r - mean) / (sd + STD_EPS) for r in group])
        elif kind == Estimator.dr_grpo:
            out.append([r - mean for r in group])
        else:
            out.append([r - (sum(group) - r) / (len(group) - 1) for r in group])
    return out


@pytest.mark.parametrize("kind", list(Estimator))
def test_advantages_match_the_per_group_definitions(kind):
    r = _rewards()
    got = advantages(r, kind)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, torch.tensor(_naive_advantages(r, kind), dtype=torch.float64), rtol=0, atol=1e-12)
    assert got[1].abs().max() == 0  # no signal from a group of equal rewards


def test_rloo_is_a_rescaled_dr_grpo():
    r = _rewards()
    torch.testing.assert_close(advantages(r, "rloo"), advantages(r, "dr_grpo") * G / (G - 1))


def test_zero_variance_marks_exactly_the_groups_of_equal_rewards():
    assert zero_variance(_rewards()).tolist() == [False, True, False, False]


def test_advantages_refuse_what_they_cannot_mean():
    for kind in Estimator:  # a group of one has no signal under any of them
        with pytest.raises(ValueError, match="group_size >= 2"):
            advantages(torch.ones(3, 1), kind)
    with pytest.raises(ValueError, match="groups, group_size"):
        advantages(torch.ones(3), "dr_grpo")


def _silent(rewards: torch.Tensor, kind: Estimator) -> bool:
    """Every advantage 0 or undefined, computed from the arithmetic (`_naive_advantages`) where it is
    defined: no learning signal."""
    try:
        adv = _naive_advantages(rewards, kind)
    except (ZeroDivisionError, statistics.StatisticsError):
        return True
    return all(a == 0 or not math.isfinite(a) for group in adv for a in group)


@pytest.mark.parametrize("kind", list(Estimator))
def test_every_estimator_has_rules_of_no_signal_that_match_its_arithmetic(kind):
    """The config refuses a composition (`no_signal`) exactly where the estimator's advantages are all 0
    or undefined, for every estimator of `Estimator`: groups of 1 to 4 completions, rewards that vary
    and rewards the config fixes (the same for every completion, 0 or not). An estimator added without
    its entry in ESTIMATORS fails here."""
    g = torch.Generator().manual_seed(1)
    for size in range(1, 5):
        varied = torch.rand(3, size, generator=g, dtype=torch.float64)
        for constant in (None, 0.0, 1.0):
            rewards = varied if constant is None else torch.full((3, size), constant, dtype=torch.float64)
            refused = no_signal(kind, size, constant)
            assert (refused is not None) == _silent(rewards, kind), (kind, size, constant, refused)
            if refused is None:  # what the config accepts, the estimator computes
                torch.testing.assert_close(advantages(rewards, kind),
                                           torch.tensor(_naive_advantages(rewards, kind), dtype=torch.float64))


# ----------------------------------------------------------------------------------- policy loss

LENS = [3, 1, 4, 2]


def _tokens(seed: int = 0):
    """Per-token tensors of 4 completions: logp (leaf), old, ref, advantages per sequence, sequence ids."""
    g = torch.Generator().manual_seed(seed)
    n = sum(LENS)
    old = -torch.rand(n, generator=g, dtype=torch.float64) * 3
    # ratios well inside and well outside the clip range, both signs of advantage
    logp = (old + torch.randn(n, generator=g, dtype=torch.float64) * 0.4).requires_grad_()
    ref = old + torch.randn(n, generator=g, dtype=torch.float64) * 0.3
    adv = torch.tensor([1.5, -0.7, 0.3, -1.2], dtype=torch.float64)
    seq = torch.repeat_interleave(torch.arange(len(LENS)), torch.tensor(LENS))
    return logp, old, ref, adv, seq


def _naive_loss(logp, old, ref, adv, spec: LossSpec, is_weight=None) -> torch.Tensor:
    """The loss from its definition: loops over sequences and tokens (autograd through scalar ops)."""
    per_seq, tokens = [], []
    start = 0
    for i, n in enumerate(LENS):
        idx = list(range(start, start + n))
        start += n
        if spec.level == RatioLevel.sequence:
            mean_log_ratio = sum(logp[t] - old[t] for t in idx) / n
            ratio_of = {t: torch.exp(mean_log_ratio) for t in idx}
        else:
            ratio_of = {t: torch.exp(logp[t] - old[t]) for t in idx}
        losses = []
        for t in idx:
            r = ratio_of[t]
            clipped = torch.clamp(r, 1 - spec.clip_low, 1 + spec.clip_high)
            lt = -torch.minimum(r * adv[i], clipped * adv[i])
            if is_weight is not None:
                lt = lt * is_weight[t]
            if spec.kl_coef:
                d = ref[t] - logp[t]
                lt = lt + spec.kl_coef * (torch.exp(d) - d - 1)
            losses.append(lt)
        per_seq.append(losses)
        tokens.extend(losses)
    if spec.aggregation == Aggregation.token_mean:
        return sum(tokens) / len(tokens)
    if spec.aggregation == Aggregation.seq_mean_token_mean:
        return sum(sum(s) / len(s) for s in per_seq) / len(per_seq)
    return sum(sum(s) for s in per_seq) / len(per_seq)


SPECS = [LossSpec(aggregation=a, level=lv, kl_coef=kl, clip_low=0.2, clip_high=ch)
         for a in Aggregation for lv in RatioLevel for kl, ch in ((0.0, 0.2), (0.05, 0.28))]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.aggregation.value}-{s.level.value}-kl{s.kl_coef}")
def test_policy_loss_and_its_gradient_match_the_naive_definition(spec):
    logp, old, ref, adv, seq = _tokens()
    out = policy_loss(logp, old, adv[seq], seq, len(LENS), spec, ref=ref)
    ours = out.total / out.units
    (g_ours,) = torch.autograd.grad(ours, logp)
    theirs = _naive_loss(logp, old, ref, adv, spec)
    (g_theirs,) = torch.autograd.grad(theirs, logp)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-12, atol=1e-12)
    assert out.units == (sum(LENS) if spec.aggregation == Aggregation.token_mean else len(LENS))
    clipped = out.sums["clipped"].item()
    assert 0 < clipped < sum(LENS), "a batch where clipping cannot tell conventions apart"


def test_truncated_importance_weights_scale_each_tokens_surrogate():
    logp, old, ref, adv, seq = _tokens()
    w = torch.rand(sum(LENS), generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 2
    spec = LossSpec()
    out = policy_loss(logp, old, adv[seq], seq, len(LENS), spec, is_weight=w)
    torch.testing.assert_close(out.total / out.units, _naive_loss(logp, old, ref, adv, spec, is_weight=w))


def test_on_policy_gradient_is_minus_the_advantage_per_token():
    """At ratio 1 (the first update of a rollout) d loss / d logp_t = -A_t / N under token_mean."""
    _, old, _, adv, seq = _tokens()
    logp = old.clone().requires_grad_()
    out = policy_loss(logp, logp.detach(), adv[seq], seq, len(LENS), LossSpec())
    (g,) = torch.autograd.grad(out.total / out.units, logp)
    torch.testing.assert_close(g, -adv[seq] / sum(LENS))


@pytest.mark.parametrize("agg", list(Aggregation))
def test_any_cut_into_micro_batches_sums_to_the_whole(agg):
    """The trainer divides the window's summed loss by its summed units: the same loss however the
    completions are split into micro-batches (each holding whole completions)."""
    logp, old, ref, adv, seq = _tokens()
    spec = LossSpec(aggregation=agg, kl_coef=0.1)
    whole = policy_loss(logp, old, adv[seq], seq, len(LENS), spec, ref=ref)
    total, units = 0.0, 0
    start = 0
    for part in ([0, 1], [2], [3]):
        n = sum(LENS[i] for i in part)
        sl = slice(start, start + n)
        start += n
        local = torch.repeat_interleave(torch.arange(len(part)), torch.tensor([LENS[i] for i in part]))
        out = policy_loss(logp[sl], old[sl], adv[part][local], local, len(part), spec, ref=ref[sl])
        total, units = total + out.total, units + out.units
    torch.testing.assert_close(total / units, whole.total / whole.units, rtol=1e-12, atol=1e-12)


def test_sequence_level_ratio_is_one_per_completion():
    logp, old, _, adv, seq = _tokens()
    out = policy_loss(logp, old, adv[seq], seq, len(LENS), LossSpec(level=RatioLevel.sequence))
    from align.objectives.policy_loss import ratios

    r = ratios(logp.detach(), old, seq, len(LENS), RatioLevel.sequence)
    for i in range(len(LENS)):
        vals = r[seq == i]
        assert torch.all(vals == vals[0])
        assert math.isclose(math.log(vals[0].item()), ((logp - old)[seq == i]).mean().item(), rel_tol=1e-9)
    assert out.sums["ratio"].item() == pytest.approx(r.sum().item())


def test_kl_needs_a_reference():
    logp, old, _, adv, seq = _tokens()
    with pytest.raises(ValueError, match="reference"):
        policy_loss(logp, old, adv[seq], seq, len(LENS), LossSpec(kl_coef=0.1))
