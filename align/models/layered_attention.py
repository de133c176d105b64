"""`attention=layered`: each layer type gets the kernel that serves it, through transformers' own
attention and mask interfaces (no model code is re-implemented).

Gemma-4 mixes sliding layers (head_dim 256, a 1024-token window) with global layers (head_dim 512,
keys equal to values). transformers' sdpa path gives the sliding layers a dense window mask past the
window, which knocks SDPA off its flash kernels onto the dense-mask one (every key of the row
visited), and no flash kernel takes head dim 512. What each candidate costs at this model's shapes
on the H200 is in docs/benchmarks/log.md#e-2026-12-01-gemma4-attention (bench/attention_layers.py
measures it).

The rule, per call:
- a layer whose head_dim is above flash's 256 (Gemma-4's global layers) runs `chunked_attention`,
  matmul attention (bf16 GEMMs, fp32 softmax) under the causal rule or the dense mask it was given;
- a sliding layer on an unpadded row past its window gets no mask (`layered_mask`) and runs
  `windowed_attention`: PyTorch's flash kernel with the window as its left bound on CUDA in bf16 or
  fp16 (only the band's keys are visited), the same band through `chunked_attention` elsewhere;
- every other call runs transformers' `sdpa_attention_forward` with transformers' own mask (flash
  within the window; a padded or packed row keeps its dense mask).

Measured and dropped for the sliding layers past the window (docs/performance.md):
- flex_attention with a sliding-window block mask: 2.8x the dense-mask kernel per call, but a block
  mask's sizes are Python ints of the width. With it (and a chunk loop over the width on the global
  layers) the compiled blocks recompiled per ragged width until dynamo's limit sent them to eager.
- matmul attention over each query chunk's band of keys: its slice bounds are computed from the
  width, which made compiling the blocks take minutes.
- matmul attention over the full square: it keeps [rows, heads, width, width] probabilities per
  layer for backward, 25 layers of them.
The flash kernel takes the width as a tensor shape and the window as an argument, so one dynamic
graph serves every width.

A maskless layer's band is the kernel's business here, so the mask gate (align/probes/mask.py)
reads it from the kernel's own output (`observed_band`), in the dtype the layers compute in.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch
import torch.utils.checkpoint

NAME = "align_layered"
"""The name under which the attention and mask functions are registered with transformers."""
FLASH_MAX_HEAD_DIM = 256
FLASH_DTYPES = (torch.bfloat16, torch.float16)
CHUNK_ROWS = 4096
"""Query rows per pass in `chunked_attention`: one pass for rows up to this width (its fp32 scores for
16 heads are 1 GiB at 4096 x 4096), fixed-size chunks past it."""


def chunked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor],
                      scaling: float, window: Optional[int] = None, chunk_rows: Optional[int] = None) -> torch.Tensor:
    """Softmax attention of q [B, H, Q, D] over k, v [B, Hkv, K, D] (H a multiple of Hkv; the
    queries are the last Q of the K positions) through batched matmuls (bf16 GEMMs, fp32 softmax).
    With `mask` None: causal, and within `window` positions when given; else the boolean (True =
    attend) or additive mask [B|1, 1, Q, K] decides alone. The query heads of one key head are folded
    into the rows, so keys and values are never repeated. Up to `chunk_rows` queries run in one pass
    with no width-dependent slicing, so one dynamic compiled graph serves every ragged width (slice
    bounds computed from the width made dynamo's symbolic shapes explode: minutes of compiling).
    Returns [B, H, Q, D]. `chunk_rows`: default CHUNK_ROWS."""
    Q, K = query.shape[2], key.shape[2]
    chunk_rows = chunk_rows or CHUNK_ROWS
    if Q <= chunk_rows:
        return _attend(query, key, value, mask, scaling, window, K - Q)
    # Past one pass, each pass is recomputed in backward rather than keeping its [H, chunk, K]
    # probabilities (in fp32 and the value dtype) for it: at 16 heads and a 16,384-token row those
    # would be about 24 GiB per layer, so backward holds one pass's scores at a time instead.
    attend = _attend
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        attend = functools.partial(torch.utils.checkpoint.checkpoint, _attend, use_reentrant=False)
    # torch.split, not a loop over range(0, Q, chunk_rows): dynamo then guards on the number of passes
    # rather than on Q itself, so ragged rows past one pass compile one graph per pass count, not one
    # per width (which reached the recompile limit and ran the blocks eager).
    masks = [None] * -(-Q // chunk_rows) if mask is None else torch.split(mask, chunk_rows, dim=2)
    outs = [attend(q, key, value, m, scaling, window, K - Q + i * chunk_rows)
            for i, (q, m) in enumerate(zip(torch.split(query, chunk_rows, dim=2), masks))]
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


def windowed_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float, window: int,
                       dropout: float = 0.0) -> torch.Tensor:
    """Causal attention within `window` positions (key k reaches query q iff q - window < k <= q, the
    band of transformers' sliding-window mask) of q [B, H, S, D] over k, v [B, Hkv, S, D] on one
    unpadded row each. On CUDA in bf16/fp16 it is PyTorch's flash kernel with `window - 1` as its
    left bound: it visits only the band's keys, takes grouped key/value heads as they are and has
    its own backward (aten's derivative passes the window on). Elsewhere `chunked_attention` gives
    the same band. Under autocast it computes in the autocast dtype, as SDPA does (transformers'
    rotary embedding leaves fp32 queries under fp32 weights). Returns [B, S, H, D], the attention
    interface's layout."""
    if torch.is_autocast_enabled(query.device.type):
        dtype = torch.get_autocast_dtype(query.device.type)
        query, key, value = (t.to(dtype) for t in (query, key, value))
    if query.is_cuda and query.dtype in FLASH_DTYPES and query.shape[-1] <= FLASH_MAX_HEAD_DIM:
        S = query.shape[2]
        # transformers' q/k/v are [B, S, H, D] views transposed: transposing back is free.
        return torch.ops.aten._flash_attention_forward(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), None, None, S, S, dropout, True,
            False, scale=scaling, window_size_left=window - 1, window_size_right=0)[0]
    return _matmul(query, key, value, None, scaling, window, dropout)


def _matmul(query, key, value, mask, scaling, window, dropout) -> torch.Tensor:
    """`chunked_attention` in the attention interface's [B, Q, H, D] layout; it has no dropout."""
    if dropout > 0:
        raise ValueError("attention=layered: chunked attention has no attention dropout")
    return chunked_attention(query, key, value, mask, scaling, window=window).transpose(1, 2).contiguous()


def layered_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: Any, scaling: Optional[float] = None, dropout: float = 0.0,
                              sliding_window: Optional[int] = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface signature: returns ([B, Q, H, D], None). `sliding_window`
    is what the attention module passes (Gemma-4: its window on sliding layers, None on the rest)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    if query.shape[-1] > FLASH_MAX_HEAD_DIM:
        window = sliding_window if attention_mask is None else None  # a dense mask carries its window
        return _matmul(query, key, value, attention_mask, scale, window, dropout), None
    S, K = query.shape[2], key.shape[2]
    if attention_mask is None and sliding_window and K > sliding_window:  # `layered_mask` left the window to us
        if K == S:
            return windowed_attention(query, key, value, scale, sliding_window, dropout), None
        return _matmul(query, key, value, None, scale, sliding_window, dropout), None  # the last S of K positions
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                  sliding_window=sliding_window, **kwargs)


def layered_mask(*args, **kwargs):
    """transformers' mask-interface signature: None where the band is plain causal within the layer's
    window on unpadded rows of a fresh forward (the kernel applies it: `windowed_attention` past the
    window, sdpa's causal flash within it), else transformers' sdpa mask (None on an unpadded row a
    global layer sees whole, a dense mask with the window and padding in it otherwise). transformers
    allows the causal skip only where nothing else shapes the mask (no packing, no extra mask
    functions), and the skip here keeps to that."""
    from transformers.masking_utils import sdpa_mask

    if _window_only(kwargs):
        return None
    return sdpa_mask(*args, **kwargs)


def _window_only(kw: dict[str, Any]) -> bool:
    """A sliding layer's mask that is the causal window alone: no padding mask, no cache offset, as
    many queries as keys, and transformers willing to skip the causal mask."""
    return (kw.get("local_size") is not None and kw.get("allow_is_causal_skip", True)
            and kw.get("attention_mask") is None and not kw.get("q_offset", 0) and not kw.get("kv_offset", 0)
            and "q_length" in kw and kw.get("q_length") == kw.get("kv_length"))


def observed_band(module: torch.nn.Module, length: int) -> torch.Tensor:
    """[Q, K] which keys reach which query through the path `module` runs on an unpadded row of
    `length` tokens, read from the kernel itself: all-zero queries and keys give every key the kernel
    lets in an equal share, and one-hot values name those keys, head_dim of them per call. The
    queries are in the autocast dtype where autocast is on (as the layer's are in training: the
    kernel a call takes depends on it), else in the weights' dtype."""
    p = next(module.parameters())
    on = torch.is_autocast_enabled(p.device.type)
    dtype = torch.get_autocast_dtype(p.device.type) if on else p.dtype
    D, groups = module.head_dim, getattr(module, "num_key_value_groups", 1)
    zeros_q = torch.zeros(1, groups, length, D, device=p.device, dtype=dtype)
    zeros_k = torch.zeros(1, 1, length, D, device=p.device, dtype=dtype)
    seen = torch.zeros(length, length, dtype=torch.bool)
    for start in range(0, length, D):
        n = min(D, length - start)
        v = torch.zeros(1, 1, length, D, device=p.device, dtype=dtype)
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


def pass_variants(config: Any, max_seq_len: int, device_type: str) -> int:
    """Graphs a compiled block frame adds for rows past one `chunked_attention` pass: one per pass
    count beyond the first (dynamo guards on the count, not the width), for each layer type whose
    long rows take that path (the wide head dims everywhere; the windowed layers too off CUDA, where
    `windowed_attention` falls back to it). `config`: the model's (text) config."""
    extra_passes = max(0, -(-max_seq_len // CHUNK_ROWS) - 1)
    if not extra_passes:
        return 0
    chunked = {kind for kind, entry in plan(config).items()
               if entry["head_dim"] > FLASH_MAX_HEAD_DIM or (entry["window"] and device_type != "cuda")}
    return extra_passes * len(chunked)


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
            entry["past_window"] = (dense + ", causal, windowed" if wide else "flash with its window as the left "
                                    "bound (bf16/fp16 on CUDA; chunked matmul attention with the window elsewhere)")
        else:
            entry["unpadded"] = dense + ", causal"
        entry["masked"] = dense + " with the dense mask (window included)"
        out[kind] = entry
    return out
