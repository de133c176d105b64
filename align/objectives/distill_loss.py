"""The distillation losses on logits: the math only, no model and no data.

Per completion token, over the full vocabulary, with s = log_softmax(student_logits / T) and
t = log_softmax(teacher_logits / T) (T: `temperature`), as TRL 1.16's `GKDTrainer.generalized_jsd_loss`
(trl/experimental/gkd/gkd_trainer.py) defines them, through `F.kl_div(input, target, log_target=True)`,
which is KL(target || input):

    beta = 0:       KL(teacher || student)                                 (forward KL)
    beta = 1:       KL(student || teacher)                                 (reverse KL)
    0 < beta < 1:   beta KL(teacher || m) + (1 - beta) KL(student || m),   m = (1 - beta) student + beta teacher

`loss=reverse_kl` is beta = 1. `token_divergence` gives one value per token (summed over the vocabulary);
the objective sums them over a micro-batch and the loop divides by the window's completion tokens:
TRL's reduction "batchmean" with a labels mask (the divergence summed over the kept positions, divided
by their count) where the window is one micro-batch on one rank (tested against it in
tests/unit/objectives/test_distill_loss.py). Computed in fp32 whatever the logits' dtype.

`reference_divergence` is the same quantity written from the probabilities, without `kl_div` or
`logsumexp`: the step-0 gate (align/objectives/distill.py) holds the loss that runs against it.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def token_divergence(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float,
                     temperature: float = 1.0) -> torch.Tensor:
    """[N, V] logits of both models at the same N positions -> [N] divergence per position (fp32)."""
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} differ in shape (a vocabulary of another size?)")
    return _divergence(*_log_probs(student_logits, teacher_logits, temperature), beta)


def _log_probs(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float):
    return (F.log_softmax(student_logits.float() / temperature, dim=-1),
            F.log_softmax(teacher_logits.float() / temperature, dim=-1))


def _divergence(s: torch.Tensor, t: torch.Tensor, beta: float) -> torch.Tensor:
    if beta == 0:
        out = F.kl_div(s, t, reduction="none", log_target=True)
    elif beta == 1:
        out = F.kl_div(t, s, reduction="none", log_target=True)
    else:
        b = torch.tensor(beta, dtype=s.dtype, device=s.device)
        m = torch.logsumexp(torch.stack([s + torch.log1p(-b), t + torch.log(b)]), dim=0)
        out = b * F.kl_div(m, t, reduction="none", log_target=True) + (1 - b) * F.kl_div(m, s, reduction="none",
                                                                                             log_target=True)
    return out.sum(-1)


def reference_divergence(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float,
                         temperature: float = 1.0) -> torch.Tensor:
    """`token_divergence` from its definition in probabilities (the module doc), for the gate."""
    p = torch.softmax(student_logits.double() / temperature, dim=-1)
    q = torch.softmax(teacher_logits.double() / temperature, dim=-1)

    def kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.where(a > 0, a * (a.log() - b.log()), torch.zeros_like(a)).sum(-1)

    if beta == 0:
        return kl(q, p)
    if beta == 1:
        return kl(p, q)
    m = (1 - beta) * p + beta * q
    return beta * kl(q, m) + (1 - beta) * kl(p, m)


def head_logits(hidden: torch.Tensor, weight: torch.Tensor, softcap: Optional[float]) -> torch.Tensor:
    """The LM head over hidden states (the model's final logit softcapping applied)."""
    logits = F.linear(hidden, weight.to(hidden.dtype))
    if softcap is not None:
        logits = torch.tanh(logits.float() / softcap) * softcap
    return logits


def _head_terms(s_hidden: torch.Tensor, s_weight: torch.Tensor, t_hidden: torch.Tensor, t_weight: torch.Tensor,
                targets: torch.Tensor, s_cap: Optional[float], t_cap: Optional[float], beta: float,
                temperature: float) -> torch.Tensor:
    s_logits, t_logits = head_logits(s_hidden, s_weight, s_cap), head_logits(t_hidden, t_weight, t_cap)
    if s_logits.shape != t_logits.shape:
        raise ValueError(f"student logits {tuple(s_logits.shape)} and teacher logits {tuple(t_logits.shape)} differ "
                         "in shape (a vocabulary of another size?)")
    s, t = _log_probs(s_logits, t_logits, temperature)
    at = targets[:, None]
    return torch.stack([_divergence(s, t, beta), s.gather(1, at)[:, 0].detach(), t.gather(1, at)[:, 0]], dim=-1)


def chunked_divergence(s_hidden: torch.Tensor, s_weight: torch.Tensor, t_hidden: torch.Tensor,
                       t_weight: torch.Tensor, s_cap: Optional[float], t_cap: Optional[float], *, chunk: int,
                       targets: torch.Tensor, beta: float, temperature: float) -> torch.Tensor:
    """[N, 3] from both models' final hidden states at N positions: the divergence (with grad), and the
    student's and the teacher's tempered log-prob of `targets` (detached). The heads are applied `chunk` > 0
    positions at a time under activation checkpointing (at most [chunk, vocab] logits of each model
    exist), or all at once."""
    if not chunk:
        return _head_terms(s_hidden, s_weight, t_hidden, t_weight, targets, s_cap, t_cap, beta, temperature)
    parts = [checkpoint(_head_terms, s_hidden[i:i + chunk], s_weight, t_hidden[i:i + chunk], t_weight,
                        targets[i:i + chunk], s_cap, t_cap, beta, temperature, use_reentrant=False)
             for i in range(0, s_hidden.shape[0], chunk)]
    return torch.cat(parts) if parts else s_hidden.new_zeros(0, 3, dtype=torch.float32)
