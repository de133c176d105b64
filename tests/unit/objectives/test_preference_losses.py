"""Preference losses: each against a naive per-pair implementation (plain fp64 floats, written from the
papers' formulas, not from the vectorised code), gradients against finite differences of that naive
loss, and, where TRL is installed (the test extra), against TRL 1.16's own trainer code on the same
batch in fp32."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from align.objectives.preference_losses import (
    PairLogps,
    PreferenceLoss,
    check_hyperparameters,
    preference_loss,
)
from align.objectives.preference_spec import needs_reference

L = PreferenceLoss

# (loss, hyper-parameters): every loss at two settings
CASES = [
    (L.sigmoid, dict(beta=0.1)),
    (L.sigmoid, dict(beta=0.5)),
    (L.ipo, dict(beta=0.1)),
    (L.ipo, dict(beta=0.5)),
    (L.hinge, dict(beta=0.1)),
    (L.hinge, dict(beta=0.5)),
    (L.robust, dict(beta=0.1, label_smoothing=0.1)),
    (L.robust, dict(beta=0.5, label_smoothing=0.3)),
    (L.conservative, dict(beta=0.1, label_smoothing=0.1)),
    (L.conservative, dict(beta=0.5, label_smoothing=0.25)),
    (L.simpo, dict(beta=2.0, simpo_gamma=0.5)),
    (L.simpo, dict(beta=2.5, simpo_gamma=1.4)),
    (L.orpo, dict(beta=0.1)),
    (L.orpo, dict(beta=1.0)),
]
IDS = [f"{k.value}-" + "-".join(f"{n}={v}" for n, v in hp.items()) for k, hp in CASES]
PAIRS = 24


def _batch(kind: PreferenceLoss, dtype: torch.dtype, *, extreme: bool = True, nll_tokens: int | None = None,
           seed: int = 0) -> PairLogps:
    """Fixed random pairs: token counts 1..63, per-token log-probs in (-3, -0.05), references a few nats
    away; with `extreme`, two pairs 800 nats from their reference (|beta d| up to 400: a naive exp of the
    wrong sign would overflow in fp32)."""
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    nc = torch.randint(1, 64, (PAIRS,), generator=g)
    nr = torch.randint(1, 64, (PAIRS,), generator=g)
    pc = -torch.empty(PAIRS, dtype=f64).uniform_(0.05, 3.0, generator=g) * nc
    pr = -torch.empty(PAIRS, dtype=f64).uniform_(0.05, 3.0, generator=g) * nr
    rc = pc + 3 * torch.randn(PAIRS, dtype=f64, generator=g)
    rr = pr + 3 * torch.randn(PAIRS, dtype=f64, generator=g)
    if extreme:
        rc[0] -= 800
        rr[1] -= 800
    x = PairLogps(pc.to(dtype), pr.to(dtype), nc, nr)
    if needs_reference(kind):
        x = replace(x, reference_chosen=rc.to(dtype), reference_rejected=rr.to(dtype))
    if kind is L.orpo:
        # the SFT term covers the response and some prompt tokens
        prompt = torch.randint(0, 20, (PAIRS,), generator=g)
        extra = torch.empty(PAIRS, dtype=f64).uniform_(0.5, 2.0, generator=g) * prompt
        tokens = nc + prompt if nll_tokens is None else torch.full((PAIRS,), nll_tokens)
        x = replace(x, chosen_nll=(-pc + extra).to(dtype), chosen_nll_tokens=tokens)
    return x


# ------------------------------------------------------------------------------------ naive, fp64


def _softplus(z: float) -> float:
    """log(1 + e^z) = -log sigmoid(-z); plain, fine for |z| < 700, which the batches keep to."""
    return math.log1p(math.exp(z))


def _log_odds(avg_logp: float) -> float:
    p = math.exp(avg_logp)
    return math.log(p) - math.log1p(-p)


def _naive(kind: PreferenceLoss, p: dict, beta: float, label_smoothing: float = 0.0,
           simpo_gamma: float = 0.0) -> tuple[float, float, float]:
    """(loss, chosen reward, rejected reward) of one pair, from the papers' formulas."""
    eps = label_smoothing
    if kind is L.simpo or kind is L.orpo:
        ac, ar = p["policy_chosen"] / p["chosen_tokens"], p["policy_rejected"] / p["rejected_tokens"]
        if kind is L.simpo:
            loss = _softplus(-(beta * ac - beta * ar - simpo_gamma))
        else:
            sft = p["chosen_nll"] / p["chosen_nll_tokens"]
            loss = sft + beta * _softplus(-(_log_odds(ac) - _log_odds(ar)))
        return loss, beta * ac, beta * ar
    log_ratio_c = p["policy_chosen"] - p["reference_chosen"]
    log_ratio_r = p["policy_rejected"] - p["reference_rejected"]
    z = beta * (log_ratio_c - log_ratio_r)
    # l(z) = -log sigmoid(z): the logistic loss of the label "chosen wins"; l(-z) of the flipped label
    if kind is L.sigmoid:
        loss = _softplus(-z)
    elif kind is L.hinge:
        loss = max(0.0, 1.0 - z)
    elif kind is L.ipo:
        h = log_ratio_c / p["chosen_tokens"] - log_ratio_r / p["rejected_tokens"]
        loss = (h - 1.0 / (2.0 * beta)) ** 2
    elif kind is L.conservative:
        loss = (1 - eps) * _softplus(-z) + eps * _softplus(z)
    elif kind is L.robust:
        loss = ((1 - eps) * _softplus(-z) - eps * _softplus(z)) / (1 - 2 * eps)
    else:
        raise AssertionError(kind)
    return loss, beta * log_ratio_c, beta * log_ratio_r


def _pairs(x: PairLogps) -> list[dict]:
    fields = {n: getattr(x, n) for n in x.__dataclass_fields__ if getattr(x, n) is not None}
    return [{n: float(t[i]) for n, t in fields.items()} for i in range(PAIRS)]


def _map(x: PairLogps, fn) -> PairLogps:
    return PairLogps(**{n: None if t is None else fn(t) for n, t in vars(x).items()})


def test_every_loss_is_covered():
    assert {k for k, _ in CASES} == set(PreferenceLoss)


@pytest.mark.parametrize("dtype,rtol,atol", [(torch.float64, 1e-12, 1e-12), (torch.float32, 2e-6, 1e-6)])
@pytest.mark.parametrize("kind,hp", CASES, ids=IDS)
def test_matches_the_naive_loss_and_rewards(kind, hp, dtype, rtol, atol):
    x = _batch(kind, dtype)
    out = preference_loss(kind, x, **hp)
    # naive on the very values the vectorised code got (fp32-rounded in the fp32 case), in fp64
    want = torch.tensor([_naive(kind, p, **hp) for p in _pairs(x)], dtype=torch.float64)
    assert out.losses.dtype == dtype
    for got, col in ((out.losses, 0), (out.chosen_rewards, 1), (out.rejected_rewards, 2)):
        torch.testing.assert_close(got.double(), want[:, col], rtol=rtol, atol=atol)


_DIFFERENTIABLE = ("policy_chosen", "policy_rejected", "reference_chosen", "reference_rejected", "chosen_nll")


@pytest.mark.parametrize("kind,hp", CASES, ids=IDS)
def test_gradients_match_finite_differences_of_the_naive_loss(kind, hp):
    x = _batch(kind, torch.float64)
    leaves = {n: getattr(x, n).clone().requires_grad_() for n in _DIFFERENTIABLE if getattr(x, n) is not None}
    preference_loss(kind, replace(x, **leaves), **hp).losses.sum().backward()
    h = 1e-5
    for name, leaf in leaves.items():
        fd = []
        for p in _pairs(x):
            up, down = dict(p), dict(p)
            up[name] += h
            down[name] -= h
            fd.append((_naive(kind, up, **hp)[0] - _naive(kind, down, **hp)[0]) / (2 * h))
        torch.testing.assert_close(leaf.grad, torch.tensor(fd, dtype=torch.float64), rtol=1e-6, atol=1e-7,
                                   msg=lambda m, name=name: f"d loss / d {name}: {m}")


# -------------------------------------------------------------------------------------- properties

_AT_REFERENCE = {
    L.sigmoid: lambda hp: math.log(2),
    L.conservative: lambda hp: math.log(2),
    L.robust: lambda hp: math.log(2),
    L.hinge: lambda hp: 1.0,
    L.ipo: lambda hp: 1 / (4 * hp["beta"] ** 2),
}


@pytest.mark.parametrize("kind,hp", [c for c in CASES if needs_reference(c[0])],
                         ids=[i for c, i in zip(CASES, IDS) if needs_reference(c[0])])
def test_at_the_reference_the_loss_has_its_known_value_and_rewards_are_zero(kind, hp):
    x = _batch(kind, torch.float64)
    x = replace(x, reference_chosen=x.policy_chosen.clone(), reference_rejected=x.policy_rejected.clone())
    pc = x.policy_chosen.clone().requires_grad_()
    pr = x.policy_rejected.clone().requires_grad_()
    out = preference_loss(kind, replace(x, policy_chosen=pc, policy_rejected=pr), **hp)
    torch.testing.assert_close(out.losses, torch.full((PAIRS,), _AT_REFERENCE[kind](hp), dtype=torch.float64))
    assert torch.all(out.chosen_rewards == 0) and torch.all(out.rejected_rewards == 0)
    sums = out.metric_sums(torch.zeros(PAIRS, dtype=torch.bool))
    assert sums["rewards/margin"] == 0 and sums["rewards/accuracy"] == 0, "a tie is not a correct preference"
    out.losses.sum().backward()
    # the first step moves toward the chosen response and away from the rejected one
    assert torch.all(pc.grad < 0) and torch.all(pr.grad > 0)


def test_reference_free_losses_at_equal_average_log_probs():
    x = _batch(L.simpo, torch.float64)
    x = replace(x, policy_rejected=x.policy_chosen / x.chosen_tokens * x.rejected_tokens)
    simpo = preference_loss(L.simpo, x, beta=2.0, simpo_gamma=0.5)
    # -log sigmoid(-gamma): the margin gamma is still to be won
    torch.testing.assert_close(simpo.losses, torch.full((PAIRS,), math.log1p(math.exp(0.5)), dtype=torch.float64))
    nll, tokens = -x.policy_chosen, x.chosen_tokens
    orpo = preference_loss(L.orpo, replace(x, chosen_nll=nll, chosen_nll_tokens=tokens), beta=0.25)
    torch.testing.assert_close(orpo.losses, nll / tokens + 0.25 * math.log(2))
    torch.testing.assert_close(orpo.chosen_rewards, orpo.rejected_rewards)


def test_orpo_keeps_full_precision_for_near_certain_responses():
    mpmath = pytest.importorskip("mpmath")  # a dependency of torch (through sympy)
    mpmath.mp.dps = 50
    # average log-probs near 0 (1 - p cancels there), on both sides of -log 2, and far out
    ac = torch.tensor([-1e-9, -1e-6, -1e-3, -0.69, -0.7, -3.0, -40.0], dtype=torch.float64)
    ar = torch.tensor([-2e-9, -0.5, -1e-5, -0.7, -0.69, -1e-7, -45.0], dtype=torch.float64)
    ones = torch.ones_like(ac)
    x = PairLogps(ac, ar, ones, ones, chosen_nll=torch.zeros_like(ac), chosen_nll_tokens=ones)
    got = preference_loss(L.orpo, x, beta=1.0).losses

    def exact(c: float, r: float) -> float:
        def lo(a):
            return a - mpmath.log(-mpmath.expm1(a))
        return float(mpmath.log1p(mpmath.exp(-(lo(mpmath.mpf(c)) - lo(mpmath.mpf(r))))))

    want = torch.tensor([exact(float(c), float(r)) for c, r in zip(ac, ar)], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_window_metrics_are_sums_over_micro_batches_divided_by_the_pair_count():
    x = _batch(L.sigmoid, torch.float64)
    truncated = torch.arange(PAIRS) % 3 == 0
    whole = preference_loss(L.sigmoid, x, beta=0.1)
    parts = (slice(0, 10), slice(10, PAIRS))
    sums = [preference_loss(L.sigmoid, _map(x, lambda t, s=s: t[s]), beta=0.1).metric_sums(truncated[s])
            for s in parts]
    means = {k: float(sums[0][k] + sums[1][k]) / PAIRS for k in sums[0]}
    margin = whole.chosen_rewards - whole.rejected_rewards
    want = {
        "loss": whole.losses.mean(), "rewards/chosen": whole.chosen_rewards.mean(),
        "rewards/rejected": whole.rejected_rewards.mean(), "rewards/margin": margin.mean(),
        "rewards/accuracy": (margin > 0).double().mean(), "logps/chosen": x.policy_chosen.mean(),
        "logps/rejected": x.policy_rejected.mean(), "truncated_fraction": truncated.double().mean(),
    }
    assert means.keys() == want.keys()
    for k, v in want.items():
        assert means[k] == pytest.approx(float(v), rel=1e-6), k
    assert 0 < means["rewards/accuracy"] < 1 and means["truncated_fraction"] == pytest.approx(8 / PAIRS)


def test_bf16_inputs_are_computed_in_fp32():
    x = _batch(L.sigmoid, torch.bfloat16, extreme=False)
    out = preference_loss(L.sigmoid, x, beta=0.1)
    assert out.losses.dtype == torch.float32
    # bf16 would resolve d only to its own precision; fp32 on the same bf16 values is what is wanted
    x32 = _map(x, lambda t: t.float() if t.is_floating_point() else t)
    torch.testing.assert_close(out.losses, preference_loss(L.sigmoid, x32, beta=0.1).losses, rtol=0, atol=0)


# -------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("loss,hp,param", [
    ("dpo", dict(beta=0.1), "loss"),
    (L.sigmoid, dict(beta=0.0), "beta"),
    (L.sigmoid, dict(beta=-0.1), "beta"),
    (L.sigmoid, dict(beta=float("nan")), "beta"),
    (L.sigmoid, dict(beta=float("inf")), "beta"),
    (L.sigmoid, dict(beta=True), "beta"),
    (L.sigmoid, dict(beta="0.1"), "beta"),
    (L.robust, dict(beta=0.1, label_smoothing=0.5), "label_smoothing"),
    (L.robust, dict(beta=0.1, label_smoothing=-0.01), "label_smoothing"),
    (L.conservative, dict(beta=0.1, label_smoothing=float("nan")), "label_smoothing"),
    (L.sigmoid, dict(beta=0.1, label_smoothing=0.1), "label_smoothing"),
    (L.simpo, dict(beta=2.0, label_smoothing=0.1), "label_smoothing"),
    (L.simpo, dict(beta=2.0, simpo_gamma=-0.5), "simpo_gamma"),
    (L.simpo, dict(beta=2.0, simpo_gamma=float("inf")), "simpo_gamma"),
    (L.orpo, dict(beta=0.1, simpo_gamma=0.5), "simpo_gamma"),
])
def test_bad_hyperparameters_are_refused_with_one_line_naming_them(loss, hp, param):
    with pytest.raises(ValueError) as e:
        check_hyperparameters(loss, **hp)
    msg = str(e.value)
    assert msg.startswith(f"{param}: ") and "\n" not in msg
    # the loss entry point refuses the same, before touching a tensor
    with pytest.raises(ValueError, match=f"^{param}: "):
        preference_loss(loss, _batch(L.sigmoid, torch.float32), **hp)


def test_accepted_hyperparameters_pass_and_the_name_becomes_the_enum():
    assert check_hyperparameters("robust", beta=1, label_smoothing=0.0) is L.robust
    assert check_hyperparameters(L.simpo, beta=2.0, simpo_gamma=0.0) is L.simpo


@pytest.mark.parametrize("kind,change,param", [
    (L.sigmoid, dict(reference_chosen=None), "reference_chosen/reference_rejected"),
    (L.ipo, dict(reference_rejected=None), "reference_chosen/reference_rejected"),
    (L.simpo, dict(reference_chosen=torch.zeros(PAIRS)), "reference_chosen/reference_rejected"),
    (L.orpo, dict(chosen_nll=None), "chosen_nll/chosen_nll_tokens"),
    (L.hinge, dict(chosen_nll=torch.zeros(PAIRS), chosen_nll_tokens=torch.ones(PAIRS)), "chosen_nll/chosen_nll_tokens"),
    (L.sigmoid, dict(policy_rejected=torch.zeros(PAIRS - 1)), "policy_rejected"),
    (L.orpo, dict(chosen_nll_tokens=torch.ones(1)), "chosen_nll_tokens"),
    (L.sigmoid, dict(policy_chosen=torch.zeros(2, PAIRS // 2)), "policy_chosen"),
    (L.sigmoid, dict(policy_chosen=torch.zeros(PAIRS, dtype=torch.long)), "policy_chosen"),
])
def test_bad_inputs_are_refused_with_one_line_naming_them(kind, change, param):
    hp = dict(CASES[[k for k, _ in CASES].index(kind)][1])
    with pytest.raises(ValueError) as e:
        preference_loss(kind, replace(_batch(kind, torch.float32), **change), **hp)
    assert str(e.value).startswith(f"{param}: ") and "\n" not in str(e.value)


def test_metric_sums_refuse_a_truncation_flag_of_the_wrong_length():
    out = preference_loss(L.sigmoid, _batch(L.sigmoid, torch.float32), beta=0.1)
    with pytest.raises(ValueError, match="^truncated: "):
        out.metric_sums(torch.zeros(PAIRS + 1, dtype=torch.bool))


# -------------------------------------------------------------------------------------------- TRL
# TRL's losses live inside its trainers. Each trainer is built with object.__new__ and given only the
# attributes its loss code reads; the model forward is replaced by outputs that carry our log-probs.

_TRL_DPO = {L.sigmoid: "sigmoid", L.ipo: "ipo", L.hinge: "hinge", L.robust: "robust"}
TOL = dict(rtol=1e-5, atol=1e-5)


def _accelerator() -> SimpleNamespace:
    return SimpleNamespace(device=torch.device("cpu"), gather=lambda t: t, gather_for_metrics=lambda t: t)


class _Forward:
    """Stands in for the fused-LM-head model DPOTrainer calls: returns fixed per-token outputs."""

    training = True

    def __init__(self, outputs: SimpleNamespace) -> None:
        self.outputs = outputs

    def __call__(self, **kwargs) -> SimpleNamespace:
        return self.outputs


def _trl_dpo(kind: PreferenceLoss, hp: dict, x: PairLogps) -> tuple[torch.Tensor, dict]:
    """TRL DPOTrainer._compute_loss on a batch whose per-token log-probs sum to x's sums (each whole sum at
    the first completion position, zeros elsewhere: the sums are exact) and whose completion masks count
    x's tokens (read by ipo)."""
    from trl.trainer.dpo_trainer import DPOTrainer

    counts = torch.cat([x.chosen_tokens, x.rejected_tokens])
    length = int(counts.max()) + 2
    sums = torch.cat([x.policy_chosen, x.policy_rejected])
    log_probs = torch.cat([sums[:, None], sums.new_zeros(2 * PAIRS, length - 2)], dim=1)
    positions = torch.arange(length)[None, :]
    completion_mask = ((positions >= 1) & (positions <= counts[:, None])).long()
    outputs = SimpleNamespace(log_probs=log_probs, entropy=torch.zeros_like(log_probs),
                              mean_logits=torch.zeros_like(log_probs),
                              is_top1=torch.zeros_like(log_probs, dtype=torch.bool))
    trainer = object.__new__(DPOTrainer)
    model = _Forward(outputs)
    trainer.__dict__.update(
        model=model, accelerator=_accelerator(), aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
        f_divergence_type="reverse_kl", loss_types=[_TRL_DPO[kind]], loss_weights=[1.0], beta=hp["beta"],
        label_smoothing=hp.get("label_smoothing", 0.0), use_weighting=False, _metrics={"train": defaultdict(list)},
        _total_train_tokens=0, _tp_size=1,
    )
    inputs = {"input_ids": torch.zeros(2 * PAIRS, length, dtype=torch.long),
              "attention_mask": torch.ones(2 * PAIRS, length, dtype=torch.long), "completion_mask": completion_mask,
              "ref_chosen_logps": x.reference_chosen, "ref_rejected_logps": x.reference_rejected}
    loss = trainer._compute_loss(model, inputs, return_outputs=False)
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return loss, {"rewards/chosen": metrics["rewards/chosen"], "rewards/rejected": metrics["rewards/rejected"],
                  "rewards/margin": metrics["rewards/margins"], "rewards/accuracy": metrics["rewards/accuracies"],
                  "logps/chosen": metrics["logps/chosen"], "logps/rejected": metrics["logps/rejected"]}


def _cpo_trainer(hp: dict, loss_type: str):
    from trl.experimental.cpo import CPOTrainer

    trainer = object.__new__(CPOTrainer)
    trainer.__dict__.update(accelerator=_accelerator(), alpha=0.0, beta=hp["beta"], loss_type=loss_type,
                            label_smoothing=hp.get("label_smoothing", 0.0), simpo_gamma=hp.get("simpo_gamma", 0.0),
                            cpo_alpha=0.0, aux_loss_enabled=False)
    return trainer


def _trl_conservative(hp: dict, x: PairLogps) -> tuple[torch.Tensor, dict]:
    """CPOTrainer's label-smoothed sigmoid (what DPOTrainer's sigmoid was before TRL dropped its smoothing),
    fed with the log-ratios where CPO has log-probs."""
    losses, chosen, rejected = _cpo_trainer(hp, "sigmoid").cpo_loss(x.policy_chosen - x.reference_chosen,
                                                                    x.policy_rejected - x.reference_rejected)
    return losses.mean(), {"rewards/chosen": chosen.mean().item(), "rewards/rejected": rejected.mean().item(),
                           "rewards/accuracy": (chosen > rejected).float().mean().item()}


def _averages(x: PairLogps) -> tuple[torch.Tensor, torch.Tensor]:
    # what TRL's get_batch_logps(average_log_prob=True) returns for these sums and counts
    return x.policy_chosen / x.chosen_tokens, x.policy_rejected / x.rejected_tokens


def _trl_metrics(metrics: dict) -> dict:
    names = {"rewards/chosen": "rewards/chosen", "rewards/rejected": "rewards/rejected",
             "rewards/margin": "rewards/margins", "rewards/accuracy": "rewards/accuracies"}
    return {ours: float(metrics[theirs]) for ours, theirs in names.items()}


def _trl_simpo(hp: dict, x: PairLogps) -> tuple[torch.Tensor, dict]:
    """CPOTrainer.get_batch_loss_metrics with loss_type="simpo" and cpo_alpha=0 (SimPO proper); the forward
    returns the averaged log-probs."""
    trainer = _cpo_trainer(hp, "simpo")
    ac, ar = _averages(x)
    logits = torch.zeros(PAIRS, 2, 3)
    trainer.concatenated_forward = lambda model, batch: (ac, ar, logits, logits, torch.tensor(0.0))
    loss, metrics = trainer.get_batch_loss_metrics(None, {})
    return loss, _trl_metrics(metrics)


def _trl_orpo(hp: dict, x: PairLogps) -> tuple[torch.Tensor, dict]:
    """ORPOTrainer.get_batch_loss_metrics; the forward returns the averaged log-probs and, as TRL's NLL, the
    token mean over all chosen sequences (x gives every pair as many NLL tokens, where that equals the mean
    of per-pair token means)."""
    from trl.experimental.orpo import ORPOTrainer

    trainer = object.__new__(ORPOTrainer)
    trainer.__dict__.update(accelerator=_accelerator(), beta=hp["beta"], aux_loss_enabled=False)
    ac, ar = _averages(x)
    nll = x.chosen_nll.sum() / x.chosen_nll_tokens.sum()
    logits = torch.zeros(PAIRS, 2, 3)
    trainer.concatenated_forward = lambda model, batch: (ac, ar, logits, logits, nll)
    loss, metrics = trainer.get_batch_loss_metrics(None, {})
    return loss, _trl_metrics(metrics)


def _trl(kind: PreferenceLoss, hp: dict, x: PairLogps) -> tuple[torch.Tensor, dict]:
    if kind in _TRL_DPO:
        return _trl_dpo(kind, hp, x)
    return {L.conservative: _trl_conservative, L.simpo: _trl_simpo, L.orpo: _trl_orpo}[kind](hp, x)


@pytest.mark.parametrize("kind,hp", CASES, ids=IDS)
def test_matches_trl(kind, hp):
    pytest.importorskip("trl", reason="TRL (the test extra) is not installed: no parity check against it")
    x = _batch(kind, torch.float32, nll_tokens=12)
    grads = {}
    results = []
    for side in ("align", "trl"):
        leaves = {n: getattr(x, n).clone().requires_grad_() for n in ("policy_chosen", "policy_rejected", "chosen_nll")
                  if getattr(x, n) is not None}
        xs = replace(x, **leaves)
        if side == "align":
            out = preference_loss(kind, xs, **hp)
            sums = out.metric_sums(torch.zeros(PAIRS, dtype=torch.bool))
            loss, metrics = out.losses.mean(), {k: float(v) / PAIRS for k, v in sums.items()}
        else:
            loss, metrics = _trl(kind, hp, xs)
        assert loss.dtype == torch.float32
        loss.backward()
        grads[side] = {n: t.grad for n, t in leaves.items()}
        results.append((loss.detach(), metrics))
    (ours, our_metrics), (theirs, their_metrics) = results
    torch.testing.assert_close(ours, theirs, **TOL)
    for name, grad in grads["trl"].items():
        torch.testing.assert_close(grads["align"][name], grad, **TOL, msg=lambda m, n=name: f"d loss / d {n}: {m}")
    for name, value in their_metrics.items():
        assert our_metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-5), name
    assert 0 < our_metrics["rewards/accuracy"] < 1, "a batch where accuracy cannot tell conventions apart"
