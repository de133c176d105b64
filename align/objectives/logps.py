"""Per-sequence summed log-probs of a micro-batch that holds several sequences (the two sides of
preference pairs, a group of rollouts): each label position names its sequence in `seq_ids`
(-1: no target), and the token log-probs are summed into their sequence with `index_add`.

Two ways to the same sums, as for SFT's loss (align/objectives/ce.py): from all logits at once, or, when the
model's head was bypassed (`hidden_only`), from hidden states with the head applied over `chunk`
target tokens at a time under activation checkpointing, so at most [chunk, vocab] logits exist."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from align.data.collate import IGNORE


def _head_logps(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                softcap: Optional[float], temperature: float = 1.0) -> torch.Tensor:
    logits = F.linear(hidden, weight.to(hidden.dtype))
    if softcap is not None:
        logits = torch.tanh(logits.float() / softcap) * softcap
    return _logps(logits, labels, temperature)


def _logps(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = logits.float()
    if temperature != 1.0:  # the distribution a rollout sampled from: log softmax(logits / T)
        logits = logits / temperature
    return -F.cross_entropy(logits, labels, reduction="none")


def token_logps(out: torch.Tensor, labels: torch.Tensor, head: Optional[torch.nn.Module] = None, chunk: int = 0,
                softcap: Optional[float] = None, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs of the target tokens [N] in fp32, their flat positions [N]). `out` is logits, or
    hidden states when `head` is given (then the head is applied to the target positions only, `chunk`
    > 0 target tokens per checkpointed slice, or all at once). `temperature` divides the logits."""
    y = labels.reshape(-1)
    keep = torch.nonzero(y != IGNORE).squeeze(1)
    y = y.index_select(0, keep)
    flat = out.reshape(-1, out.shape[-1]).index_select(0, keep)
    if head is None:
        return _logps(flat, y, temperature), keep
    if not chunk:
        return _head_logps(flat, head.weight, y, softcap, temperature), keep
    parts = [checkpoint(_head_logps, flat[i : i + chunk], head.weight, y[i : i + chunk], softcap, temperature,
                        use_reentrant=False)
             for i in range(0, flat.shape[0], chunk)]
    return (torch.cat(parts) if parts else flat.new_zeros(0, dtype=torch.float32)), keep


def sequence_sums(values: torch.Tensor, keep: torch.Tensor, seq_ids: torch.Tensor, n_seq: int) -> torch.Tensor:
    """Sum per sequence of per-target `values` (positions `keep` of the flattened [B, L] labels)."""
    seq = seq_ids.reshape(-1).index_select(0, keep)
    return values.new_zeros(n_seq).index_add_(0, seq, values)


def sequence_token_counts(seq_ids: torch.Tensor, n_seq: int) -> torch.Tensor:
    """Target tokens per sequence (fp32)."""
    s = seq_ids.reshape(-1)
    s = s[s >= 0]
    return torch.bincount(s, minlength=n_seq).to(torch.float32)
