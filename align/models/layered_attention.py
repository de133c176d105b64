"""`attention=layered`: each layer type gets the kernel that serves it, through transformers' own
attention and mask interfaces (no model code is re-implemented).

Gemma-4 mixes sliding layers (head_dim 256, a 1024-token window) with global layers (head_dim 512,
keys equal to values). transformers' sdpa path gives the sliding layers a dense window mask past the
window, which knocks SDPA off flash onto the memory-efficient kernel, and no flash kernel takes head
dim 512. What each candidate costs at this model's shapes on the H200 is in docs/performance.md
(bench/attention_layers.py measures it). The rules, per call:

- a layer handed a flex `BlockMask` (a sliding layer past its window on CUDA): transformers'
  `flex_attention_forward`, which skips the blocks outside the window;
- head_dim above flash's 256 (Gemma-4's global layers): `chunked_attention`, query chunks through
  batched matmuls (bf16 GEMMs, fp32 softmax), with whatever mask the layer was given;
- anything else (a sliding layer within its window, every layer of a small-head model):
  transformers' `sdpa_attention_forward` (is_causal, flash first).

The mask side: a sliding layer whose window binds gets a BlockMask on CUDA (flex has no backward
on CPU) and transformers' dense sdpa mask elsewhere; every other layer gets what transformers' sdpa
path gives it (None on unpadded rows). The mask gate (align/probes/mask.py) checks whichever it gets.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

NAME = "align_layered"
"""The name under which the attention and mask functions are registered with transformers."""
FLASH_MAX_HEAD_DIM = 256
CHUNK = 1024
"""Query rows per chunk in `chunked_attention`: a 16-head, 4096-key chunk's fp32 scores are 256 MiB."""


def chunked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor],
                      scaling: float, chunk: int = CHUNK) -> torch.Tensor:
    """Softmax attention of q [B, H, Q, D] over k, v [B, Hkv, K, D] (H a multiple of Hkv), causal
    when `mask` is None, else under the boolean (True = attend) or additive mask [B|1, 1, Q, K]. The
    query heads of one key head are folded into the rows, so keys and values are never repeated.
    Returns [B, H, Q, D]."""
    B, H, Q, D = query.shape
    Hkv, K = key.shape[1], key.shape[2]
    rep = H // Hkv
    q = query.reshape(B, Hkv, rep, Q, D)
    kt = key.transpose(-1, -2)
    out = []
    for s in range(0, Q, chunk):
        e = min(Q, s + chunk)
        keys = K if mask is not None else K - Q + e  # causal: nothing past the chunk's last query
        scores = torch.matmul(q[:, :, :, s:e].reshape(B, Hkv, rep * (e - s), D), kt[..., :keys]).float()
        scores = scores.view(B, Hkv, rep, e - s, keys) * scaling
        if mask is None:
            qi = torch.arange(K - Q + s, K - Q + e, device=query.device)[:, None]
            allowed = torch.arange(keys, device=query.device)[None, :] <= qi
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        else:
            m = mask[:, :, s:e, :keys].unsqueeze(2)  # [B|1, 1, 1, chunk, K]
            scores = (scores.masked_fill(~m, torch.finfo(scores.dtype).min) if m.dtype == torch.bool
                      else scores + m.float())
        probs = scores.softmax(-1).to(value.dtype).view(B, Hkv, rep * (e - s), keys)
        out.append(torch.matmul(probs, value[:, :, :keys]).view(B, Hkv, rep, e - s, D))
    return torch.cat(out, dim=3).reshape(B, H, Q, D)


def layered_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: Any, scaling: Optional[float] = None, dropout: float = 0.0,
                              **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface signature: returns ([B, Q, H, D], None)."""
    from torch.nn.attention.flex_attention import BlockMask
    from transformers.integrations.flex_attention import flex_attention_forward
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if isinstance(attention_mask, BlockMask):
        return flex_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    if query.shape[-1] > FLASH_MAX_HEAD_DIM:
        if dropout > 0:
            raise ValueError("attention=layered: chunked attention has no attention dropout")
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        return chunked_attention(query, key, value, attention_mask, scale).transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                  **kwargs)


def layered_mask(*args, **kwargs):
    """transformers' mask-interface signature. A sliding layer whose window binds (`local_size` set and
    shorter than the keys) gets a flex BlockMask on CUDA; everything else transformers' sdpa mask."""
    from transformers.masking_utils import flex_attention_mask, sdpa_mask

    local, kv_length = kwargs.get("local_size"), kwargs.get("kv_length")
    device = torch.device(kwargs.get("device", "cpu"))
    if local is not None and kv_length is not None and kv_length > local and device.type == "cuda":
        return flex_attention_mask(*args, **kwargs)
    return sdpa_mask(*args, **kwargs)


def register() -> str:
    """Register both functions with transformers (idempotent); returns the implementation name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, layered_attention_forward)
    AttentionMaskInterface.register(NAME, layered_mask)
    return NAME


def plan(config: Any) -> dict[str, dict[str, Any]]:
    """What each layer type of `config` runs under attention=layered, for the manifest (the rules
    above applied to the layer's head dim and window; tests/unit/models/test_layered_attention.py
    checks the calls take these paths)."""
    types = list(getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers)
    per_layer = getattr(config, "per_layer_config", None)
    out: dict[str, dict[str, Any]] = {}
    for i, kind in enumerate(types):
        if kind in out:
            out[kind]["layers"] += 1
            continue
        head_dim = (per_layer[i] if per_layer is not None else config).head_dim
        window = getattr(config, "sliding_window", None) if kind == "sliding_attention" else None
        wide = head_dim > FLASH_MAX_HEAD_DIM
        dense = "chunked matmul attention" if wide else "sdpa (flash first)"
        entry: dict[str, Any] = {"layers": 1, "head_dim": head_dim, "window": window}
        if window:
            entry["within_window"] = dense + ", causal"
            entry["past_window"] = ("flex_attention with a sliding-window block mask on CUDA; elsewhere "
                                    + dense + " with a dense window mask")
        else:
            entry["unpadded"] = dense + ", causal"
            entry["masked"] = dense + " with the dense mask"
        out[kind] = entry
    return out
