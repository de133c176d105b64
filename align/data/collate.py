"""Collate rows into a micro-batch: right-pad to the longest row (optionally rounded up), and shift
labels here so the loss is one cross-entropy over aligned (logit, target) pairs.

A micro-batch without padding carries NO attention mask: an explicit mask takes SDPA off its
is_causal fast path (LANDMINES 2, playbook 3.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from align.data.encode import EncodedDataset

IGNORE = -100


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, L]
    labels: torch.Tensor  # [B, L], already shifted: labels[b, t] is the target of logits[b, t]
    attention_mask: Optional[torch.Tensor]  # [B, L] or None when no row is padded
    rows: np.ndarray  # dataset indices
    tokens: int  # B * L, what the model computes on
    real_tokens: int  # non-padding tokens
    loss_tokens: int  # targets that count in the loss

    def model_inputs(self) -> dict:
        kw = {"input_ids": self.input_ids, "use_cache": False}
        if self.attention_mask is not None:
            kw["attention_mask"] = self.attention_mask
        return kw

    def to(self, device: torch.device) -> "Batch":
        nb = device.type == "cuda"
        self.input_ids = self.input_ids.to(device, non_blocking=nb)
        self.labels = self.labels.to(device, non_blocking=nb)
        if self.attention_mask is not None:
            self.attention_mask = self.attention_mask.to(device, non_blocking=nb)
        return self


def collate(data: EncodedDataset, rows: np.ndarray, pad_id: int, pad_to_multiple_of: int = 1) -> Batch:
    lens = data.lengths[rows]
    width = int(lens.max())
    width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    labels = np.full((len(rows), width), IGNORE, dtype=np.int64)
    for b, r in enumerate(rows):
        t, m = data.row(int(r))
        n = len(t)
        ids[b, :n] = t
        # target of position p is token p+1, when token p+1 is a loss token
        tgt = np.where(m[1:], t[1:], IGNORE)
        labels[b, : n - 1] = tgt
    real = int(lens.sum())
    padded = real != ids.size
    mask = None
    if padded:
        mask = torch.from_numpy((np.arange(width)[None, :] < lens[:, None]).astype(np.int64))
    return Batch(
        input_ids=torch.from_numpy(ids),
        labels=torch.from_numpy(labels),
        attention_mask=mask,
        rows=np.asarray(rows),
        tokens=ids.size,
        real_tokens=real,
        loss_tokens=int((labels != IGNORE).sum()),
    )
