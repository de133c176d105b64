"""`attention=layered`: each layer type gets the kernel that serves it, through transformers' own
attention and mask interfaces (no model code is re-implemented).

Gemma-4 mixes sliding layers (head_dim 256, a 1024-token window) with global layers (head_dim 512,
keys equal to values). transformers' sdpa path gives the sliding layers a dense window mask past the
window, which knocks SDPA off flash onto the memory-efficient kernel, and no flash kernel takes head
dim 512. What each candidate costs at this model's shapes on the H200 is in docs/performance.md
(bench/attention_layers.py measures it).

The rule, per call: a layer whose head_dim is above flash's 256 (Gemma-4's global layers) runs
`chunked_attention`, matmul attention (bf16 GEMMs, fp32 softmax) under the causal rule or the dense
mask it was given; every other layer runs transformers' `sdpa_attention_forward` with transformers'
own mask (flash first; the sliding layers past their window keep the dense window mask).

Measured and dropped for the sliding layers past the window (docs/performance.md):
- flex_attention with a sliding-window block mask: 2.8x the dense-mask kernel per call, but a block
  mask's sizes are Python ints of the width. With it (and a chunk loop over the width on the global
  layers) the compiled blocks recompiled per ragged width until dynamo's limit sent them to eager.
- matmul attention over each query chunk's band of keys: its slice bounds are computed from the
  width, which made compiling the blocks take minutes.
- matmul attention over the full square: it keeps [rows, heads, width, width] probabilities per
  layer for backward, 25 layers of them.

A maskless layer's band is the kernel's business here, so the mask gate (align/probes/mask.py)
reads it from the kernel's own output (`observed_band`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

NAME = "align_layered"
"""The name under which the attention and mask functions are registered with transformers."""
FLASH_MAX_HEAD_DIM = 256
CHUNK_ROWS = 4096
"""Query rows per pass in `chunked_attention`: one pass for rows up to this width (its fp32 scores for
16 heads are 1 GiB at 4096 x 4096), fixed-size chunks past it."""


def chunked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor],
                      scaling: float, window: Optional[int] = None, chunk_rows: int = CHUNK_ROWS) -> torch.Tensor:
    """Softmax attention of q [B, H, Q, D] over k, v [B, Hkv, K, D] (H a multiple of Hkv; the
    queries are the last Q of the K positions) through batched matmuls (bf16 GEMMs, fp32 softmax).
    With `mask` None: causal, and within `window` positions when given; else the boolean (True =
    attend) or additive mask [B|1, 1, Q, K] decides alone. The query heads of one key head are folded
    into the rows, so keys and values are never repeated. Up to `chunk_rows` queries run in one pass
    with no width-dependent slicing, so one dynamic compiled graph serves every ragged width (slice
    bounds computed from the width made dynamo's symbolic shapes explode: minutes of compiling).
    Returns [B, H, Q, D]."""
    Q, K = query.shape[2], key.shape[2]
    if Q <= chunk_rows:
        return _attend(query, key, value, mask, scaling, window, K - Q)
    outs = [_attend(query[:, :, s:s + chunk_rows], key, value,
                    None if mask is None else mask[:, :, s:s + chunk_rows], scaling, window, K - Q + s)
            for s in range(0, Q, chunk_rows)]
    return torch.cat(outs, dim=2)


def _attend(query, key, value, mask, scaling, window, first) -> torch.Tensor:
    """One pass; `first`: the key position of the first of these queries."""
    B, H, Q, D = query.shape
    Hkv, K = key.shape[1], key.shape[2]
    rep = H // Hkv
    scores = torch.matmul(query.reshape(B, Hkv, rep * Q, D), key.transpose(-1, -2)).float() * scaling
    scores = scores.view(B, Hkv, rep, Q, K)
    if mask is None:
        qi = torch.arange(first, first + Q, device=query.device)[:, None]
        ki = torch.arange(K, device=query.device)[None, :]
        allowed = (ki <= qi) & (qi - ki < window) if window else ki <= qi
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    else:
        m = mask.unsqueeze(2)  # [B|1, 1, 1, Q, K]
        scores = scores.masked_fill(~m, torch.finfo(scores.dtype).min) if m.dtype == torch.bool else scores + m.float()
    probs = scores.softmax(-1).to(value.dtype).view(B, Hkv, rep * Q, K)
    return torch.matmul(probs, value).view(B, Hkv, rep, Q, D).reshape(B, H, Q, D)


def layered_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: Any, scaling: Optional[float] = None, dropout: float = 0.0,
                              sliding_window: Optional[int] = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface signature: returns ([B, Q, H, D], None). `sliding_window`
    is what the attention module passes (Gemma-4: its window on sliding layers, None on the rest)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[-1] > FLASH_MAX_HEAD_DIM:
        if dropout > 0:
            raise ValueError("attention=layered: chunked attention has no attention dropout")
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        window = sliding_window if attention_mask is None else None  # a dense mask carries its window
        out = chunked_attention(query, key, value, attention_mask, scale, window=window)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                  sliding_window=sliding_window, **kwargs)


def layered_mask(*args, **kwargs):
    """transformers' mask-interface signature: its sdpa mask (None on an unpadded row a layer sees
    whole, else a dense mask with the window and padding in it)."""
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def observed_band(module: torch.nn.Module, length: int) -> torch.Tensor:
    """[Q, K] which keys reach which query through the path `module` runs on an unpadded row of
    `length` tokens, read from the kernel itself: all-zero queries and keys give every key the kernel
    lets in an equal share, and one-hot values name those keys, head_dim of them per call."""
    p = next(module.parameters())
    D, groups = module.head_dim, getattr(module, "num_key_value_groups", 1)
    zeros_q = torch.zeros(1, groups, length, D, device=p.device, dtype=p.dtype)
    zeros_k = torch.zeros(1, 1, length, D, device=p.device, dtype=p.dtype)
    seen = torch.zeros(length, length, dtype=torch.bool)
    for start in range(0, length, D):
        n = min(D, length - start)
        v = torch.zeros(1, 1, length, D, device=p.device, dtype=p.dtype)
        v[0, 0, torch.arange(start, start + n), torch.arange(n)] = 1
        with torch.no_grad():
            out, _ = layered_attention_forward(module, zeros_q, zeros_k, v, None, scaling=1.0,
                                               sliding_window=getattr(module, "sliding_window", None))
        seen[:, start:start + n] = (out[0, :, 0, :n] > 0).cpu()
    return seen


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
    checks the calls take these paths), with the shapes the attention sees: query heads, key/value
    heads, head dim, window (None: causal over the row). bench/attention_layers.py times these shapes.
    Per-layer values are read where the config has them (Gemma-4's `per_layer_config`: the global
    layers' head dim and key/value heads differ from the sliding layers')."""
    types = list(getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers)
    per_layer = getattr(config, "per_layer_config", None)
    out: dict[str, dict[str, Any]] = {}
    for i, kind in enumerate(types):
        if kind in out:
            out[kind]["layers"] += 1
            continue
        layer = per_layer[i] if per_layer is not None else config
        head_dim = layer.head_dim
        window = getattr(config, "sliding_window", None) if kind == "sliding_attention" else None
        wide = head_dim > FLASH_MAX_HEAD_DIM
        dense = "chunked matmul attention" if wide else "sdpa (flash first)"
        # Query heads from the top-level config, as Gemma-4's attention module sizes q_proj.
        entry: dict[str, Any] = {"layers": 1, "heads": config.num_attention_heads,
                                 "kv_heads": layer.num_key_value_heads, "head_dim": head_dim, "window": window}
        if window:
            entry["within_window"] = dense + ", causal"
            entry["past_window"] = dense + " with transformers' dense window mask"
        else:
            entry["unpadded"] = dense + ", causal"
        entry["masked"] = dense + " with the dense mask (window included)"
        out[kind] = entry
    return out
