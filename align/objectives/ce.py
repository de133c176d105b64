"""SFT loss: cross-entropy summed over loss tokens; the trainer divides by the number of loss tokens
in the whole accumulation window (all ranks), so every target token weighs the same however the
window was cut into micro-batches.

Two ways to the same number:
- `ce_sum(logits, labels)`: the model computes all logits ([tokens, vocab]), then one fp32 CE.
- `ChunkedCE` (trainer.loss_chunk_tokens > 0): the model returns its last hidden states (the LM head
  is bypassed for the forward, `bypass_lm_head`), and the head + CE run chunk by chunk under
  activation checkpointing, so at most [chunk, vocab] logits exist at once in forward or backward.
  What bounds logits memory for large vocabularies (Gemma-4: 262k).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from align.data.collate import IGNORE


def ce_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of token cross-entropies in fp32 over positions whose label is not IGNORE."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")


def _chunk_ce(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
              softcap: Optional[float]) -> torch.Tensor:
    logits = F.linear(hidden, weight.to(hidden.dtype))
    if softcap is not None:
        logits = torch.tanh(logits.float() / softcap) * softcap
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE, reduction="sum")


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
        total = hidden.new_zeros((), dtype=torch.float32)
        weight = self.head.weight
        for i in range(0, h.shape[0], self.chunk):
            total = total + checkpoint(_chunk_ce, h[i : i + self.chunk], weight, y[i : i + self.chunk], self.softcap,
                                       use_reentrant=False)
        return total


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
