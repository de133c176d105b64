"""The KV cache the align engine allocates: one row ("slot") per sequence being decoded, each layer's keys
and values as `(slots, kv_heads, length, head_dim)` buffers, written in place at each row's own position.

A layer with a sliding window keeps only its window: its buffer is `window` long and position `p` lives at
`p % window`. Attention does not care about the order of the keys it reads (their positions are already
in them through the rotary embedding), so a row of length `n` attends to the first `min(n, window)`
entries of such a buffer: the ring holds exactly the keys the window admits.

`SlotCache` is handed to transformers' model classes as their `cache`: the attention modules call
`update(key, value, layer_idx, kwargs=...)` and pass what it returns to the attention function, which
`align/generation/slot_attention.py` registers. A step's rows, positions and mode travel as a `StepRows`
on the cache (`cache.rows`), so the attention function reads them from the tensors it is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch


@dataclass
class StepRows:
    """Which slots a forward writes and reads, and where."""

    slots: torch.Tensor
    """(batch,) int64: the slot of each batch row."""
    positions: torch.Tensor
    """Decode: (batch,) int64, the position of the one token each row feeds. Prefill: (batch, width), the
    position of each column (left padding gets position 0 and is not written)."""
    prefill: bool
    """True: the rows feed left-padded prompts (`pad` columns of padding each); False: one token each."""
    pad: Optional[torch.Tensor] = None
    """Prefill only: (batch,) int64, columns of left padding per row."""
    fanout: Optional[torch.Tensor] = None
    """Prefill only: (batch, n) int64, every slot a prompt's keys are copied into (its samples share the
    prompt's prefill); `slots` is then `fanout[:, 0]`."""
    cu: Optional[torch.Tensor] = None
    """Packed prefill only: (prompts + 1,) int32, where each prompt starts in the one packed row (its
    cumulative lengths); `fanout` then has a row per prompt and `positions` is (1, total tokens)."""
    doc: Optional[torch.Tensor] = None
    """Packed prefill only: (total tokens,) int64, the prompt each column belongs to."""
    longest: int = 0
    """Packed prefill only: the longest prompt's length (the attention kernel's bound)."""

    @property
    def packed(self) -> bool:
        return self.cu is not None


def layer_geometry(config: Any) -> list[Optional[int]]:
    """Per decoder layer, its sliding window (None for full attention), read from the config the way the
    model classes read it: `layer_types` where the config has them, else `sliding_window` on every layer."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    types = getattr(text, "layer_types", None)
    n = text.num_hidden_layers
    if types is None:
        return [window] * n
    return [window if t == "sliding_attention" else None for t in types[:n]]


class SlotCache:
    """Per-layer key/value buffers over `num_slots` rows of `max_len` positions. Layers whose keys another
    layer computes (Gemma-4's KV sharing) never call `update` and get no buffer."""

    is_compileable = True

    def __init__(self, num_slots: int, max_len: int, shapes: dict[int, tuple[int, int]],
                 windows: list[Optional[int]], dtype: torch.dtype, device: torch.device) -> None:
        self.num_slots, self.max_len = num_slots, max_len
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.ring: dict[int, int] = {}
        for layer, (kv_heads, head_dim) in shapes.items():
            length = max_len if windows[layer] is None else min(windows[layer], max_len)
            self.ring[layer] = length
            self.keys[layer] = torch.zeros(num_slots, kv_heads, length, head_dim, dtype=dtype, device=device)
            self.values[layer] = torch.zeros_like(self.keys[layer])
        self.rows: Optional[StepRows] = None
        self.decode_paths: set[str] = set()
        self.prefill_paths: set[str] = set()
        """Which prefill attention paths wrote this cache (align/generation/slot_attention.py)."""
        """Which decode attention paths read this cache (align/generation/slot_attention.py)."""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys.values(), *self.values.values()))

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        rows = self.rows
        k_buf, v_buf, ring = self.keys[layer_idx], self.values[layer_idx], self.ring[layer_idx]
        if not rows.prefill:
            # key: (batch, kv_heads, 1, head_dim), one token per row at its own position.
            where = rows.positions % ring
            k_buf[rows.slots, :, where] = key[:, :, 0].to(k_buf.dtype)
            v_buf[rows.slots, :, where] = value[:, :, 0].to(v_buf.dtype)
            return k_buf, v_buf
        self._write_prefill(key, value, k_buf, v_buf, ring)
        # The prefill attends over the fresh keys of its own prompts (slot_attention.py builds the mask).
        return key, value

    def _write_prefill(self, key, value, k_buf, v_buf, ring: int) -> None:
        rows = self.rows
        if rows.packed:
            return self._write_packed(key, value, k_buf, v_buf, ring)
        width = key.shape[2]
        col = torch.arange(width, device=key.device)
        pos = col[None, :] - rows.pad[:, None]  # (batch, width): position of each column, < 0 on padding
        length = width - rows.pad  # prompt length per row
        # A ring keeps the last `ring` positions of the prompt; a full buffer keeps all of them.
        keep = (pos >= 0) & (pos >= (length[:, None] - ring))
        b_idx, c_idx = keep.nonzero(as_tuple=True)
        where = pos[b_idx, c_idx] % ring
        k_rows, v_rows = key[b_idx, :, c_idx].to(k_buf.dtype), value[b_idx, :, c_idx].to(v_buf.dtype)
        for j in range(rows.fanout.shape[1]):
            slots = rows.fanout[b_idx, j]
            k_buf[slots, :, where] = k_rows
            v_buf[slots, :, where] = v_rows

    def _write_packed(self, key, value, k_buf, v_buf, ring: int) -> None:
        rows = self.rows
        pos, doc = rows.positions[0], rows.doc  # (total,): each column's position and prompt
        length = (rows.cu[1:] - rows.cu[:-1]).long()[doc]
        keep = (pos >= length - ring).nonzero(as_tuple=True)[0]  # a ring keeps its prompt's last `ring` positions
        where = pos[keep] % ring
        k_rows, v_rows = key[0].transpose(0, 1)[keep].to(k_buf.dtype), value[0].transpose(0, 1)[keep].to(v_buf.dtype)
        for j in range(rows.fanout.shape[1]):
            slots = rows.fanout[doc[keep], j]
            k_buf[slots, :, where] = k_rows
            v_buf[slots, :, where] = v_rows

    # What transformers' model code may ask of a cache during a forward whose mask it does not build.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def __len__(self) -> int:
        return len(self.keys)
