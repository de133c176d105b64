"""Collate rows into a micro-batch, and shift labels here so the loss is one cross-entropy over
aligned (logit, target) pairs.

Padded: right-pad to the longest row, optionally rounded up to `pad_to_multiple_of` (bounds the set
of shapes, docs/pitfalls.md#8). A micro-batch without padding carries NO attention mask: an explicit mask
takes SDPA off its is_causal fast path (docs/pitfalls.md#2).

Packed: the rows are concatenated into one row with `position_ids` restarting at 0 per document, and
the forward gets no attention mask and `use_cache=False`: transformers then builds a block-diagonal
mask from the position ids; with a mask, or with a cache (train mode makes one when
`config.use_cache`), documents attend to each other (docs/pitfalls.md#1). A rounding tail is one more
document of padding with its own positions, and no labels.
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
    attention_mask: Optional[torch.Tensor]  # [B, L] or None when no row is padded (always None when packed)
    rows: np.ndarray  # dataset indices
    tokens: int  # B * L, what the model computes on
    real_tokens: int  # non-padding tokens
    loss_tokens: int  # targets that count in the loss
    position_ids: Optional[torch.Tensor] = None  # [1, L] when packed: restarts at 0 per document
    padding_mask: Optional[torch.Tensor] = None
    """[B, L] 1 on real tokens, whenever a row is padded, whether or not the model gets it as its
    attention mask (sampler.mask_padding): MoE router statistics leave padding out with it."""
    # Preference pairs (align.data.pairs.collate_pairs); None for chat records. Sequence s of the
    # micro-batch is row s when padded, document s when packed; pair p is sequences 2p (chosen) and 2p+1.
    seq_ids: Optional[torch.Tensor] = None
    """[B, L] int64: the sequence each LABEL position belongs to, -1 where the label is IGNORE (prompt,
    padding, a document's last token): per-sequence sums are an index_add over it."""
    chosen_seq: Optional[torch.Tensor] = None
    """[P] int64: the sequence of pair p's chosen side."""
    rejected_seq: Optional[torch.Tensor] = None
    """[P] int64: the sequence of pair p's rejected side."""
    pairs: Optional[int] = None
    """P, the pairs in this micro-batch."""
    truncated_pairs: Optional[int] = None
    """Pairs of this micro-batch with a side cut at data.max_seq_len (data.truncation=truncate)."""
    pair_rows: Optional[np.ndarray] = None
    """[P] the pairs' indices in the encoded pairs (EncodedPairs), e.g. to look up per-pair state."""
    margin: Optional[torch.Tensor] = None
    """[P] float32: each pair's `margin` (align/data/margins.py); None where the data carry none."""

    @property
    def packed(self) -> bool:
        return self.position_ids is not None

    def model_inputs(self) -> dict:
        kw = {"input_ids": self.input_ids, "use_cache": False}
        if self.position_ids is not None:
            # A mask beside packed position_ids makes transformers skip the block-diagonal mask.
            assert self.attention_mask is None, "a packed batch must not carry an attention mask (docs/pitfalls.md#1)"
            kw["position_ids"] = self.position_ids
        elif self.attention_mask is not None:
            kw["attention_mask"] = self.attention_mask
        return kw

    def to(self, device: torch.device) -> "Batch":
        nb = device.type == "cuda"
        self.input_ids = self.input_ids.to(device, non_blocking=nb)
        self.labels = self.labels.to(device, non_blocking=nb)
        if self.padding_mask is not None:
            same = self.padding_mask is self.attention_mask
            self.padding_mask = self.padding_mask.to(device, non_blocking=nb)
            if same:
                self.attention_mask = self.padding_mask
        if self.attention_mask is not None and self.attention_mask.device != device:
            self.attention_mask = self.attention_mask.to(device, non_blocking=nb)
        for name in ("position_ids", "seq_ids", "chosen_seq", "rejected_seq", "margin"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.to(device, non_blocking=nb))
        return self


def _targets(t: np.ndarray, m: np.ndarray) -> np.ndarray:
    # target of position p is token p+1, when token p+1 is a loss token
    return np.where(m[1:], t[1:], IGNORE)


def collate(data: EncodedDataset, rows: np.ndarray, pad_id: int, pad_to_multiple_of: int = 1, packed: bool = False,
            mask_padding: bool = True) -> Batch:
    """`mask_padding=False`: a right-padded micro-batch carries no attention mask. In a causal decoder a
    real token attends only to positions at its left, which are all real, so real-token logits are
    the same (tests/unit/data/test_unmasked_padding.py) and SDPA keeps is_causal; padding positions
    compute garbage that no loss reads."""
    if packed:
        return collate_packed(data, rows, pad_id, pad_to_multiple_of)
    lens = data.lengths[rows]
    width = int(lens.max())
    width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    labels = np.full((len(rows), width), IGNORE, dtype=np.int64)
    for b, r in enumerate(rows):
        t, m = data.row(int(r))
        n = len(t)
        ids[b, :n] = t
        labels[b, : n - 1] = _targets(t, m)
    real = int(lens.sum())
    mask = None
    if real != ids.size:
        mask = torch.from_numpy((np.arange(width)[None, :] < lens[:, None]).astype(np.int64))
    return Batch(
        input_ids=torch.from_numpy(ids),
        labels=torch.from_numpy(labels),
        attention_mask=mask if mask_padding else None,
        padding_mask=mask,
        rows=np.asarray(rows),
        tokens=ids.size,
        real_tokens=real,
        loss_tokens=int((labels != IGNORE).sum()),
    )


def collate_packed(data: EncodedDataset, rows: np.ndarray, pad_id: int, pad_to_multiple_of: int = 1) -> Batch:
    lens = data.lengths[rows]
    real = int(lens.sum())
    width = -(-real // pad_to_multiple_of) * pad_to_multiple_of
    ids = np.full(width, pad_id, dtype=np.int64)
    labels = np.full(width, IGNORE, dtype=np.int64)
    pos = np.zeros(width, dtype=np.int64)
    o = 0
    for r in rows:
        t, m = data.row(int(r))
        n = len(t)
        ids[o : o + n] = t
        labels[o : o + n - 1] = _targets(t, m)  # the last token of a document predicts nothing
        pos[o : o + n] = np.arange(n)
        o += n
    pos[o:] = np.arange(width - o)
    return Batch(
        input_ids=torch.from_numpy(ids)[None],
        labels=torch.from_numpy(labels)[None],
        attention_mask=None,
        rows=np.asarray(rows),
        tokens=width,
        real_tokens=real,
        loss_tokens=int((labels != IGNORE).sum()),
        position_ids=torch.from_numpy(pos)[None],
    )
