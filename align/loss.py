"""SFT loss: cross-entropy summed over loss tokens; the trainer divides by the number of loss tokens
in the whole accumulation window (all ranks), so every target token weighs the same however the
window was cut into micro-batches."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from align.data.collate import IGNORE


def ce_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of token cross-entropies in fp32 over positions whose label is not IGNORE."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE, reduction="sum")
