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

A chunk's loss and logit gradient are elementwise passes over [chunk, vocab] fp32 (the upcast, the
soft-cap's division and tanh, log-sum-exp, the softmax, the one-hot, the soft-cap's derivative, the
cast back): eager, each is its own kernel reading and writing the whole chunk. With `compiled`
(trainer.compile_loss) those passes are one torch.compile'd function, which inductor turns into a
reduction and one pointwise kernel that read the head's output and write the gradient; the GEMMs stay
outside it, as they are.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F

from align.data.collate import IGNORE


def ce_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of token cross-entropies in fp32 over positions whose label is not IGNORE."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")


def chunk_terms(s: torch.Tensor, y: torch.Tensor, softcap: Optional[float],
                grad_dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One chunk's summed CE and, given `grad_dtype`, its gradient w.r.t. the head's output `s`, written
    out of place for torch.compile to fuse (`eager_chunk_terms` is the same arithmetic in place)."""
    s = s.float()
    t = None
    if softcap is not None:
        t = torch.tanh(s / softcap)
        s = t * softcap
    lse = torch.logsumexp(s, -1)
    loss = (lse - s.gather(1, y[:, None]).squeeze(1)).sum()
    if grad_dtype is None:
        return loss, None
    onehot = torch.arange(s.shape[1], device=s.device)[None, :] == y[:, None]
    g = torch.exp(s - lse[:, None]) - onehot.float()
    if t is not None:
        g = g * (1 - t * t)
    return loss, g.to(grad_dtype)


def eager_chunk_terms(s: torch.Tensor, y: torch.Tensor, softcap: Optional[float],
                      grad_dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """`chunk_terms` in place over the head's output, for eager runs: at most two [chunk, vocab] fp32
    tensors at once (under a soft-cap; one without)."""
    s = s.float()
    t = None
    if softcap is not None:
        t = s.div_(softcap).tanh_()
        s = t * softcap
    lse = torch.logsumexp(s, -1)
    loss = (lse - s.gather(1, y[:, None]).squeeze(1)).sum()
    if grad_dtype is None:
        return loss, None
    g = s.sub_(lse[:, None]).exp_()  # softmax, in place of the scores
    g[torch.arange(len(y), device=g.device), y] -= 1
    if t is not None:
        g.mul_(t.square_().neg_().add_(1))
    return loss, g.to(grad_dtype)


@functools.cache
def compiled_chunk_terms(backend: Any) -> Callable:
    """`chunk_terms` compiled once per backend for the process (the CPU tests use "eager"); the chunk's
    row count is marked dynamic at each call, so ragged last chunks share its graph."""
    return torch.compile(chunk_terms, backend=backend)


def _call_compiled(fn: Callable, s: torch.Tensor, y: torch.Tensor, softcap: Optional[float],
                   grad_dtype: Optional[torch.dtype]):
    torch._dynamo.maybe_mark_dynamic(s, 0)
    torch._dynamo.maybe_mark_dynamic(y, 0)
    return fn(s, y, softcap, grad_dtype)


class _ChunkedCE(torch.autograd.Function):
    """Sum of token cross-entropies of `hidden @ weight.T` (soft-capped), `chunk` rows at a time, with
    the gradients taken in the forward: p = softmax(s), ds = p - onehot(y), and under a soft-cap
    s = c * tanh(z / c), so dz = ds * (1 - tanh^2); dh = dz @ W, dW = dz^T @ h. In fp32 from the
    logits on, as `ce_sum`; the GEMMs in `gemm_dtype` (the run's autocast dtype, else the hidden
    states'), as F.linear and its backward under autocast."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk, softcap, need_h, need_w, fused, gemm_dtype):
        # The head's GEMMs in the run's autocast dtype, as the full-logits path computes them inside the
        # forward's autocast: this loss runs outside it, where fp32 hidden states (fp32 weights under
        # bf16 autocast) would otherwise run the head in fp32.
        cd = gemm_dtype or hidden.dtype
        w, hidden_c = weight.to(cd), hidden.to(cd)
        total = hidden.new_zeros((), dtype=torch.float32)
        grad_h = torch.empty_like(hidden) if need_h else None
        acc = torch.promote_types(weight.dtype, torch.float32)  # the head's gradient sums over chunks in >= fp32
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        want = cd if (need_h or need_w) else None
        for i in range(0, hidden.shape[0], chunk):
            h, y = hidden_c[i : i + chunk], labels[i : i + chunk]
            if fused is not None:
                loss, g = _call_compiled(fused, F.linear(h, w), y, softcap, want)
            else:
                loss, g = eager_chunk_terms(F.linear(h, w), y, softcap, want)
            total += loss
            if g is None:
                continue
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
        return dh, dw, None, None, None, None, None, None, None


class ChunkedCE:
    """`loss_fn(hidden, labels)`: the LM head and CE over `chunk` tokens at a time; only positions
    with a target are computed at all. `compiled`: each chunk's elementwise passes through the
    compiled `chunk_terms` (with `backend`). `gemm_dtype`: the run's autocast dtype (None: the hidden
    states' dtype), which the head's GEMMs run in."""

    def __init__(self, head: torch.nn.Module, chunk: int, softcap: Optional[float], compiled: bool = False,
                 backend: Any = "inductor", gemm_dtype: Optional[torch.dtype] = None) -> None:
        self.head, self.chunk, self.softcap, self.gemm_dtype = head, chunk, softcap, gemm_dtype
        self.fused = compiled_chunk_terms(backend) if compiled else None

    def __call__(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = hidden.reshape(-1, hidden.shape[-1])
        y = labels.reshape(-1)
        keep = torch.nonzero(y != IGNORE).squeeze(1)
        h, y = h.index_select(0, keep), y.index_select(0, keep)
        weight = self.head.weight
        grad = torch.is_grad_enabled()
        return _ChunkedCE.apply(h, weight, y, self.chunk, self.softcap, grad and h.requires_grad,
                                grad and weight.requires_grad, self.fused, self.gemm_dtype)


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
