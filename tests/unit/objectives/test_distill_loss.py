"""objective=distill's loss (align/objectives/distill_loss.py) against TRL 1.16's
`GKDTrainer.generalized_jsd_loss` on the same logits (fp32, 1e-6): several betas, temperatures, a labels
mask; reverse KL is TRL's beta=1 and the hand-written KL(student || teacher); the chunked path is the
unchunked one."""

from __future__ import annotations

import inspect
import os

import pytest
import torch

from align.data.collate import IGNORE
from align.objectives.distill_loss import chunked_divergence, reference_divergence, token_divergence

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
gkd = pytest.importorskip("trl.experimental.gkd")
TRL = gkd.GKDTrainer.generalized_jsd_loss


def _logits(seed: int = 0, b: int = 3, n: int = 7, v: int = 50):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(b, n, v, generator=g) * 2
    t = torch.randn(b, n, v, generator=g) * 2
    labels = torch.randint(0, v, (b, n), generator=g)
    labels[0, :3] = IGNORE  # a prompt
    labels[2, 5:] = IGNORE  # padding
    return s, t, labels


def _align_batchmean(s, t, labels, beta, temperature):
    """What a one-micro-batch step's loss is: the per-token divergence summed over the kept positions
    (micro_loss), divided by their count (the loop's division by the window's completion tokens)."""
    keep = labels.reshape(-1) != IGNORE
    per = token_divergence(s.reshape(-1, s.shape[-1])[keep], t.reshape(-1, t.shape[-1])[keep], beta, temperature)
    return per.sum() / keep.sum()


def test_trls_generalized_jsd_loss_is_a_staticmethod_of_the_expected_signature():
    assert isinstance(inspect.getattr_static(gkd.GKDTrainer, "generalized_jsd_loss"), staticmethod)
    params = inspect.signature(TRL).parameters
    assert list(params)[:6] == ["student_logits", "teacher_logits", "labels", "beta", "temperature", "reduction"]
    assert params["reduction"].default == "batchmean"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_matches_trl_with_a_labels_mask(beta, temperature):
    s, t, labels = _logits()
    want = TRL(s, t, labels=labels, beta=beta, temperature=temperature, reduction="batchmean")
    got = _align_batchmean(s, t, labels, beta, temperature)
    assert torch.allclose(got, want, atol=1e-6, rtol=0), (got.item(), want.item())
    # and per token: TRL's reduction="none" keeps [kept positions, vocab]
    per = TRL(s, t, labels=labels, beta=beta, temperature=temperature, reduction="none").sum(-1)
    keep = labels.reshape(-1) != IGNORE
    mine = token_divergence(s.reshape(-1, 50)[keep], t.reshape(-1, 50)[keep], beta, temperature)
    assert torch.allclose(mine, per, atol=1e-6, rtol=0)


def test_the_gradient_matches_trls():
    s, t, labels = _logits(1)
    a, b = s.clone().requires_grad_(), s.clone().requires_grad_()
    TRL(a, t, labels=labels, beta=0.3).backward()
    _align_batchmean(b, t, labels, 0.3, 1.0).backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-7, rtol=0)


def test_reverse_kl_is_trls_beta_1_and_the_hand_written_kl_student_teacher():
    """TRL 1.16: beta=1 is F.kl_div(teacher_log_probs, student_log_probs, log_target=True), i.e.
    KL(student || teacher); beta=0 is KL(teacher || student)."""
    s, t, _ = _logits(2)
    s, t = s.reshape(-1, 50), t.reshape(-1, 50)
    p, q = torch.softmax(s, -1), torch.softmax(t, -1)
    hand_reverse = (p * (p.log() - q.log())).sum(-1)
    hand_forward = (q * (q.log() - p.log())).sum(-1)
    assert torch.allclose(token_divergence(s, t, 1.0), hand_reverse, atol=1e-5)
    assert torch.allclose(token_divergence(s, t, 0.0), hand_forward, atol=1e-5)
    assert torch.allclose(token_divergence(s, t, 1.0), TRL(s[None], t[None], beta=1.0, reduction="none")[0].sum(-1),
                          atol=1e-6)
    assert not torch.allclose(hand_reverse, hand_forward, atol=1e-2)  # the batch tells the directions apart


@pytest.mark.parametrize("beta", [0.0, 0.25, 1.0])
def test_the_gates_reference_is_the_same_divergence(beta):
    s, t, _ = _logits(3)
    s, t = s.reshape(-1, 50), t.reshape(-1, 50)
    assert torch.allclose(reference_divergence(s, t, beta, 1.3).float(), token_divergence(s, t, beta, 1.3), atol=1e-5)


def test_chunked_terms_equal_the_unchunked_and_carry_each_models_target_log_probs():
    g = torch.Generator().manual_seed(4)
    hs, ht = torch.randn(11, 8, generator=g), torch.randn(11, 6, generator=g)
    ws, wt = torch.randn(30, 8, generator=g), torch.randn(30, 6, generator=g)
    y = torch.randint(0, 30, (11,), generator=g)
    whole = chunked_divergence(hs, ws, ht, wt, None, None, chunk=0, targets=y, beta=0.5, temperature=0.9)
    parts = chunked_divergence(hs, ws, ht, wt, None, None, chunk=4, targets=y, beta=0.5, temperature=0.9)
    assert torch.allclose(whole, parts, atol=1e-6)
    assert torch.allclose(whole[:, 0], token_divergence(hs @ ws.T, ht @ wt.T, 0.5, 0.9), atol=1e-6)
    want = torch.log_softmax(hs @ ws.T / 0.9, -1).gather(1, y[:, None])[:, 0]
    assert torch.allclose(whole[:, 1], want, atol=1e-6)
    assert torch.allclose(whole[:, 2], torch.log_softmax(ht @ wt.T / 0.9, -1).gather(1, y[:, None])[:, 0], atol=1e-6)


def test_logits_of_another_vocabulary_are_refused():
    with pytest.raises(ValueError, match="differ in shape"):
        token_divergence(torch.zeros(2, 5), torch.zeros(2, 6), 1.0)
