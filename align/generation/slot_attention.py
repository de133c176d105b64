"""The attention function the align engine registers with transformers (`ALIGN_SLOTS`), reading the
`SlotCache` of align/generation/slots.py.

- Prefill: the admitted prompts attend over their own fresh keys, causally (and, on a sliding layer, not
  to keys older than the window). Packed (the prompts end to end in one row, no padding): on CUDA in
  bf16/fp16 torch's variable-length flash attention (`torch.nn.attention.varlen`), which skips the
  other prompts' keys; elsewhere SDPA under a block-diagonal causal mask, the reference it is tested
  against. Left-padded (where the engine does not pack, `packed_prefill`): SDPA under a causal mask that
  also hides the padding.
- Decode: one query token per row attends over its row's live keys only: `min(position + 1, ring)`
  entries of its slot. On CUDA a Triton kernel streams just those keys (one program per row and KV
  head, every query head of the group at once, an online softmax over blocks of keys); elsewhere the
  rows are gathered and masked for SDPA, the reference the kernel is tested against.

The registered name is absent from transformers' mask functions, so the model classes build no mask
(masking_utils returns early for such an implementation): the masks are this module's.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

from align.generation.slots import SlotCache

ALIGN_SLOTS = "align_slots"

_active: list[SlotCache] = []


@contextlib.contextmanager
def reading(cache: SlotCache) -> Iterator[None]:
    """Make `cache` the one the attention function reads during the forwards inside."""
    _active.append(cache)
    try:
        yield
    finally:
        _active.pop()


def register() -> None:
    """Register `ALIGN_SLOTS` with transformers' attention interface (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ALIGN_SLOTS, slot_attention)


def slot_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                   sliding_window: Optional[int] = None, **kwargs):
    if kwargs.get("softcap") is not None:
        raise ValueError("the align engine's attention has no logit soft-capping; generate with backend=hf")
    cache = _active[-1]
    rows = cache.rows
    if rows.prefill and rows.packed:
        out = _prefill_packed(query, key, value, rows, scaling, sliding_window, cache.prefill_paths)
    elif rows.prefill:
        cache.prefill_paths.add("left-padded, sdpa")
        out = _prefill(query, key, value, rows.pad, scaling, sliding_window)
    else:
        lengths = torch.clamp(rows.positions + 1, max=key.shape[2])
        out = decode_attention(query, key, value, rows.slots, lengths, scaling, cache.decode_paths)
    return out.transpose(1, 2).contiguous(), None


def _prefill(query, key, value, pad, scaling, window):
    width = query.shape[2]
    i = torch.arange(width, device=query.device)
    allowed = (i[None, :] <= i[:, None])[None] & (i[None, None, :] >= pad[:, None, None])
    if window is not None:
        allowed = allowed & (i[:, None] - i[None, :] < window)[None]
    allowed = allowed | torch.eye(width, dtype=torch.bool, device=query.device)[None]  # padding rows: no NaN
    return F.scaled_dot_product_attention(query, key, value, attn_mask=allowed[:, None], scale=scaling,
                                          enable_gqa=query.shape[1] != key.shape[1])


def _prefill_packed(query, key, value, rows, scaling, window, paths: set):
    """(1, heads, total, head_dim): each packed prompt over its own keys, causal, within `window`."""
    if varlen_usable(query.dtype, query.device, query.shape[-1]):
        paths.add("packed, varlen flash")
        return _varlen(query, key, value, rows, scaling, window)
    paths.add("packed, sdpa block-diagonal")
    doc, i = rows.doc, torch.arange(query.shape[2], device=query.device)
    allowed = (doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None])
    if window is not None:
        allowed = allowed & (i[:, None] - i[None, :] < window)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=allowed[None, None], scale=scaling,
                                          enable_gqa=query.shape[1] != key.shape[1])


def _varlen(query, key, value, rows, scaling, window):
    from torch.nn.attention.varlen import varlen_attn

    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (total, heads, head_dim)
    kw = {"scale": scaling, "window_size": (-1 if window is None else window - 1, 0)}  # flash: keys i-left..i
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in _VARLEN_PARAMS:
            kw["enable_gqa"] = True
        else:
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = varlen_attn(q, k, v, rows.cu, rows.cu, rows.longest, rows.longest, **kw)
    return out.transpose(0, 1)[None]


def _varlen_params() -> frozenset:
    try:
        import inspect

        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return frozenset()
    return frozenset(inspect.signature(varlen_attn).parameters)


_VARLEN_PARAMS = _varlen_params()
VARLEN_HEAD_DIM = 256
"""Flash attention's largest head dim: a model with a wider head (Gemma-4's global layers) prefills left-padded."""


def varlen_usable(dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
    """Whether torch's variable-length attention runs this prefill: CUDA, half precision, a head flash takes,
    and an installed signature that says causal and sliding as a window (`window_size`) and takes `scale`."""
    return (device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and head_dim <= VARLEN_HEAD_DIM
            and {"window_size", "scale"} <= _VARLEN_PARAMS)


def decode_attention(query: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor,
                     lengths: torch.Tensor, scaling: Optional[float], paths: Optional[set] = None) -> torch.Tensor:
    """(batch, heads, 1, head_dim) output of one query token per row over the first `lengths[b]` keys of
    slot `slots[b]`; the path taken is added to `paths`."""
    paths = set() if paths is None else paths
    if query.is_cuda and _triton_ok(query, k_buf):
        paths.add("triton, live keys only")
        return slot_decode(query, k_buf, v_buf, slots, lengths, query.shape[-1] ** -0.5 if scaling is None else scaling)
    paths.add("sdpa over gathered rows")
    return decode_reference(query, k_buf, v_buf, slots, lengths, scaling)


def decode_reference(query, k_buf, v_buf, slots, lengths, scaling):
    k, v = k_buf[slots], v_buf[slots]
    live = torch.arange(k.shape[2], device=k.device)[None, :] < lengths[:, None]
    return F.scaled_dot_product_attention(query, k.to(query.dtype), v.to(query.dtype), attn_mask=live[:, None, None, :],
                                          scale=scaling, enable_gqa=query.shape[1] != k.shape[1])


# ------------------------------------------------------------------------------------ the CUDA kernel

@torch.library.custom_op("align::slot_decode", mutates_args=())
def slot_decode(query: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor,
                lengths: torch.Tensor, scale: float) -> torch.Tensor:
    """The Triton kernel as one opaque operator: torch.compile fuses what surrounds it and calls it as is."""
    return _decode_triton(query, k_buf, v_buf, slots, lengths, scale)


@slot_decode.register_fake
def _(query, k_buf, v_buf, slots, lengths, scale):
    return query.new_empty(query.shape[0], query.shape[1], 1, query.shape[3])


def _triton_ok(query: torch.Tensor, k_buf: torch.Tensor) -> bool:
    head_dim = query.shape[-1]
    # float32 engines (exact copies) take the reference: tl.dot would round them to tf32. The kernel's
    # presence is a plain flag (set by `prepare`, outside any trace): tracing `_kernel()` would reach into
    # Triton's module, which dynamo cannot trace, and break the compiled step's graph inside every layer.
    return (query.dtype in (torch.bfloat16, torch.float16) and _kernel_ready and head_dim >= 16
            and head_dim & (head_dim - 1) == 0 and query.dtype == k_buf.dtype and query.shape[1] % k_buf.shape[1] == 0)


def _decode_triton(query, k_buf, v_buf, slots, lengths, scaling):
    import triton

    batch, heads, _, head_dim = query.shape
    kv_heads = k_buf.shape[1]
    group = heads // kv_heads
    q = query[:, :, 0].contiguous()
    out = torch.empty_like(q)
    scale = head_dim ** -0.5 if scaling is None else scaling
    block_n = 64 if head_dim <= 128 else 32
    _kernel()[(batch, kv_heads)](
        q, k_buf, v_buf, out, slots, lengths, scale,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), k_buf.stride(2),
        v_buf.stride(0), v_buf.stride(1), v_buf.stride(2), out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK_N=block_n,
        num_warps=4 if head_dim <= 128 else 8, num_stages=2)
    return out.view(batch, heads, 1, head_dim)


_compiled_kernel: list = []
_kernel_ready = False


def prepare(device: torch.device) -> bool:
    """Define the kernel where a CUDA device will run it, before any step is traced; whether it exists."""
    global _kernel_ready
    if device.type == "cuda":
        _kernel_ready = _kernel() is not None
    return _kernel_ready


def _kernel():
    """The Triton kernel, defined on first use (Triton is imported only where a CUDA device runs it)."""
    if _compiled_kernel:
        return _compiled_kernel[0]
    try:
        import triton
        import triton.language as tl
    except ImportError:
        _compiled_kernel.append(None)
        return None

    @triton.jit
    def decode_kernel(Q, K, V, Out, Slots, Lengths, scale,
                      s_qb, s_qh, s_ks, s_kh, s_kn, s_vs, s_vh, s_vn, s_ob, s_oh,
                      GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
        row = tl.program_id(0)
        kvh = tl.program_id(1)
        slot = tl.load(Slots + row).to(tl.int64)
        length = tl.load(Lengths + row).to(tl.int32)
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, HEAD_DIM)
        heads = kvh * GROUP + g
        q = tl.load(Q + row * s_qb + heads[:, None] * s_qh + d[None, :], mask=g[:, None] < GROUP, other=0.0)
        k_base = K + slot * s_ks + kvh * s_kh
        v_base = V + slot * s_vs + kvh * s_vh
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        for start in range(0, length, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            live = n < length
            k = tl.load(k_base + n[:, None] * s_kn + d[None, :], mask=live[:, None], other=0.0)
            s = (tl.dot(q, tl.trans(k)) * scale).to(tl.float32)  # scale may arrive as fp64 under torch.compile
            s = tl.where(live[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            v = tl.load(v_base + n[:, None] * s_vn + d[None, :], mask=live[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(Out + row * s_ob + heads[:, None] * s_oh + d[None, :], out.to(Out.dtype.element_ty),
                 mask=g[:, None] < GROUP)

    _compiled_kernel.append(decode_kernel)
    return decode_kernel
