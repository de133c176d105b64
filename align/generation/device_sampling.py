"""Sampling on the device, one token per row, with no host round trip and no global RNG state.

Each row draws from its own stream: the uniform it inverts at step `t` is a hash of the row's key (a
63-bit seed derived from the call's seed, the prompt's index and the sample's index) and `t`. A row's
draws therefore depend on nothing else in the batch, which slot it occupies or when it was admitted,
and a decode step captured in a CUDA graph replays them without touching torch's generators.

A token is drawn by inverting the cumulative distribution (the first token whose cumulative probability
reaches `u` times the total), the same law as `torch.multinomial`. Truncation follows transformers'
warpers in the order align/generation/hf.py applies them: temperature, then top-k (keep every token at
least as probable as the k-th), then top-p over the renormalised top-k distribution (in ascending order,
drop a token while the mass up to and including it is at most `1 - top_p`; the most probable always
stays), tied tokens sorted by the same `sort` call as TopPLogitsWarper's, so a cut through a tie keeps
the tokens the warper keeps.

Returned per row: the token, `logprobs` (log softmax(logits / T) at the token) and `sampler_logprobs`
(its log-prob under the truncated distribution drawn from; 0 when greedy), as align/generation/engine.py
defines them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (values kept below 2^32 in int64: no product overflows)."""
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _M32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def uniforms(keys: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """(rows,) float32 in (0, 1): row `keys[b]`'s draw at step `steps[b]`."""
    h = _mix((keys & _M32) ^ _mix(((keys >> 32) & _M32) ^ _mix(steps & _M32)))
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


@dataclass(frozen=True)
class Law:
    """Which branch of the sampler runs (each a separate captured graph); the values travel as tensors."""

    greedy: bool
    truncated: bool


def sample(logits: torch.Tensor, keys: torch.Tensor, steps: torch.Tensor, law: Law, temperature: torch.Tensor,
           top_k: torch.Tensor, top_p: torch.Tensor):
    """(token, logprob, sampler_logprob), each (rows,), from float32 `logits` (rows, vocab). `top_p` is a
    float64 0-dim tensor: `1 - top_p` then rounds to float32 as TopPLogitsWarper's Python float does."""
    if law.greedy:
        token = logits.argmax(-1)
        lp = logits.gather(-1, token[:, None])[:, 0] - logits.logsumexp(-1)
        return token, lp, torch.zeros_like(lp)
    tempered = logits / temperature
    lse = tempered.logsumexp(-1)
    u = uniforms(keys, steps)
    if not law.truncated:
        token = _draw(torch.exp(tempered - lse[:, None]), u)
        lp = tempered.gather(-1, token[:, None])[:, 0] - lse
        return token, lp, lp
    # Ascending, as TopPLogitsWarper sorts: where top-p cuts through tied tokens, the same ones stay.
    ascending, order = tempered.sort(-1)
    vocab = ascending.shape[-1]
    rank = torch.arange(vocab, device=ascending.device)[None, :]
    kth = ascending.gather(-1, (vocab - torch.where(top_k > 0, top_k, vocab)).expand(ascending.shape[0], 1))
    kept = ascending >= kth
    probs = torch.softmax(ascending.masked_fill(~kept, float("-inf")), -1)
    kept = kept & ((probs.cumsum(-1) > 1 - top_p) | (top_p >= 1) | (rank == vocab - 1))
    ordered, order, kept = ascending.flip(-1), order.flip(-1), kept.flip(-1)
    truncated = ordered.masked_fill(~kept, float("-inf"))
    at = _draw(torch.softmax(truncated, -1), u)
    token = order.gather(-1, at[:, None])[:, 0]
    lp = tempered.gather(-1, token[:, None])[:, 0] - lse
    sp = truncated.gather(-1, at[:, None])[:, 0] - truncated.logsumexp(-1)
    return token, lp, sp


def _draw(weights: torch.Tensor, u: torch.Tensor, block: int = 256) -> torch.Tensor:
    """Per row, the first index whose cumulative weight reaches `u` times the row's total: the inverse CDF
    in two levels (block sums, then one block), so no scan runs over the whole vocabulary; an index of
    weight 0 is never returned."""
    rows, vocab = weights.shape
    blocks = -(-vocab // block)
    padded = torch.nn.functional.pad(weights, (0, blocks * block - vocab)).view(rows, blocks, block)
    totals = padded.sum(-1).cumsum(-1)
    target = u * totals[:, -1]
    # target < the total (u < 1), so this block exists and holds weight: its cumulative rises past the target
    at = (totals < target[:, None]).sum(-1).clamp(max=blocks - 1)
    before = torch.where(at > 0, totals.gather(-1, (at - 1).clamp(min=0)[:, None])[:, 0], torch.zeros_like(target))
    inner = padded.gather(1, at[:, None, None].expand(rows, 1, block))[:, 0]
    within = (inner.cumsum(-1) + before[:, None] < target[:, None]).sum(-1)
    # the block's own sum may round below the target: its last token of weight then takes the draw
    last = torch.where(inner > 0, torch.arange(block, device=weights.device), -1).amax(-1)
    return at * block + torch.minimum(within, last)
