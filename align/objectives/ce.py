"""SFT loss: cross-entropy summed over loss tokens; the trainer divides by the number of loss tokens
in the whole accumulation window (all ranks), so every target token weighs the same however the
window was cut into micro-batches.

Two ways to the same number:
- `ce_sum(logits, labels)`: the model computes all logits ([tokens, vocab]), then one fp32 CE.
- `ChunkedCE` (trainer.loss_chunk_tokens > 0): the model returns its last hidden states (the LM head
  is bypassed for the forward, `bypass_lm_head`), and the head + CE run chunk by chunk, so at most
  [chunk, vocab] logits exist at once. What bounds logits memory for large vocabularies (Gemma-4:
  262k). Each chunk's gradients (w.r.t. the hidden states, and the head's weight where it trains)
  are computed in the forward, while its logits exist, and backward only scales them: the head's
  GEMM runs once forward and once per gradient, never again to recompute logits (under activation
  checkpointing it ran a third time; at 262k x 2,816 the head is a fifth of Gemma-4 26B-A4B's
  active matmul work per token).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

from align.data.collate import IGNORE


def ce_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of token cross-entropies in fp32 over positions whose label is not IGNORE."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")


class _ChunkedCE(torch.autograd.Function):
    """Sum of token cross-entropies of `hidden @ weight.T` (soft-capped), `chunk` rows at a time, with
    the gradients taken in the forward: p = softmax(s), ds = p - onehot(y), and under a soft-cap
    s = c * tanh(z / c), so dz = ds * (1 - tanh^2); dh = dz @ W, dW = dz^T @ h. In fp32 from the
    logits on, as `ce_sum`; the GEMMs in the hidden states' dtype, as F.linear's backward."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk, softcap, need_h, need_w):
        w = weight.to(hidden.dtype)
        total = hidden.new_zeros((), dtype=torch.float32)
        grad_h = torch.empty_like(hidden) if need_h else None
        acc = torch.promote_types(weight.dtype, torch.float32)  # the head's gradient sums over chunks in >= fp32
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        for i in range(0, hidden.shape[0], chunk):
            h, y = hidden[i : i + chunk], labels[i : i + chunk]
            s = F.linear(h, w).float()
            t = None
            if softcap is not None:  # in place: two [chunk, vocab] fp32 tensors at once, not three
                t = s.div_(softcap).tanh_()
                s = t * softcap
            lse = torch.logsumexp(s, -1)
            total += (lse - s.gather(1, y[:, None]).squeeze(1)).sum()
            if not (need_h or need_w):
                continue
            g = s.sub_(lse[:, None]).exp_()  # softmax, in place of the scores
            g[torch.arange(len(y), device=g.device), y] -= 1
            if t is not None:
                g.mul_(t.square_().neg_().add_(1))
            g = g.to(hidden.dtype)
            if need_h:
                grad_h[i : i + chunk] = g @ w
            if need_w:
                grad_w += (g.t() @ h).to(acc)
        ctx.weight_dtype = weight.dtype
        ctx.save_for_backward(grad_h, grad_w)
        return total

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        dh = None if grad_h is None else grad_h * grad_out.to(grad_h.dtype)
        dw = None if grad_w is None else (grad_w * grad_out).to(ctx.weight_dtype)
        return dh, dw, None, None, None, None, None


class ChunkedCE:
    """`loss_fn(hidden, labels)`: the LM head and CE over `chunk` tokens at a time; only positions
    with a target are computed at all."""

    def __init__(self, head: torch.nn.Module, chunk: int, softcap: Optional[float]) -> None:
        self.head, self.chunk, self.softcap = head, chunk, softcap

    def __call__(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = hidden.reshape(-1, hidden.shape[-1])
        y = labels.reshape(-1)
        keep = torch.nonzero(y != IGNORE).squeeze(1)
        h, y = h.index_select(0, keep), y.index_select(0, keep)
        weight = self.head.weight
        grad = torch.is_grad_enabled()
        return _ChunkedCE.apply(h, weight, y, self.chunk, self.softcap, grad and h.requires_grad,
                                grad and weight.requires_grad)


@contextlib.contextmanager
def bypass_lm_head(model: torch.nn.Module) -> Iterator[None]:
    """For one forward, make the model return its final hidden states where it returns logits: the
    output embedding becomes an identity, and a final-logit soft-cap (Gemma) is lifted (ChunkedCE
    applies it). Through the model's own forward, so hooks of wrappers around it (FSDP2's root
    all-gather) still run."""
    head = model.get_output_embeddings()
    config = model.config
    cap = getattr(config, "final_logit_softcapping", None)
    model.set_output_embeddings(torch.nn.Identity())
    if cap is not None:
        config.final_logit_softcapping = None
    try:
        yield
    finally:
        model.set_output_embeddings(head)
        if cap is not None:
            config.final_logit_softcapping = cap
