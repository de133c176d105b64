"""Which attention kernel serves each of a model's layer types, measured at the model's own shapes.

A model with mixed layer types (Gemma-4: sliding layers with head_dim 256 and a 1024-token window,
global layers with head_dim 512 and keys equal to values) has no single best backend: a dense
sliding-window mask knocks SDPA off flash, and flash does not take head_dim 512. This times forward
and backward of each candidate on random q/k/v of the layer's shape, for micro-batches of one token
budget at several widths, and checks each output against an fp32 reference with the exact mask:

  sliding:  sdpa_mask (a dense window mask: what transformers' sdpa path builds past the window),
            flex (compiled flex_attention, a sliding-window block mask), sdpa_causal (flash;
            exact only while the width is within the window), windowed (align's path past the
            window: PyTorch's flash kernel with the window as its left bound)
  global:   sdpa_causal (SDPA's own choice), sdpa_cudnn, sdpa_efficient, flex (causal block mask),
            chunked (query chunks of 1024 through bf16 matmuls, compiled per shape)
  both:     layered (align's `chunked_attention`, align/models/layered_attention.py: one pass under
            the causal and window rule, compiled with dynamic shapes as the compiled blocks run it)

    python bench/attention_layers.py --model bench/base_gemma4_lora --out attention.json [--tokens 8192]

On the CPU (`--tiny --backend eager`, tests/config/test_bench_attention_layers.py) it times nothing
worth keeping but runs every path: the rows, the reference check, the recorded refusals.

A candidate that fails (a kernel that refuses the head dim, inductor that cannot lower) is recorded
with its error, not skipped. Measured numbers go to docs/benchmarks/log.md, never into this code.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from align.models.layered_attention import plan  # noqa: E402
from bench.common import experiment_config, hf_config  # noqa: E402

SHAPE_KEYS = ("heads", "kv_heads", "head_dim", "window", "layers")
"""What the bench reads from attention=layered's `plan` per layer type; the plan's kernel descriptions
would repeat on every row."""


def band(L: int, window: Optional[int], device) -> torch.Tensor:
    q = torch.arange(L, device=device)[:, None]
    k = torch.arange(L, device=device)[None, :]
    ok = k <= q
    return ok & ((q - k) < window) if window else ok


def repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    return x if n == 1 else x.repeat_interleave(n, dim=1)


BACKEND = "inductor"
"""torch.compile's backend for the compiled candidates (--backend): the CPU test uses "eager"
(dynamo's tracing, no code generation), as the compiled-block tests do."""
_COMPILED: dict = {}


def compiled(fn: Callable, dynamic: bool) -> Callable:
    """`fn` compiled once per backend."""
    key = (fn, dynamic, BACKEND)
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(fn, backend=BACKEND, dynamic=dynamic)
    return _COMPILED[key]


# ------------------------------------------------------------------------------------ candidates


def sdpa_mask(q, k, v, window):
    rep = q.shape[1] // k.shape[1]
    mask = band(q.shape[2], window, q.device)[None, None]
    return F.scaled_dot_product_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), attn_mask=mask, scale=1.0)


def sdpa_backend(backend: Optional[str]) -> Callable:
    def run(q, k, v, window):
        if window is not None and q.shape[2] > window:
            raise ValueError("is_causal ignores the window past its width")
        rep = q.shape[1] // k.shape[1]
        k2, v2 = (k, v) if q.shape[-1] <= 256 else (repeat_kv(k, rep), repeat_kv(v, rep))
        gqa = k2.shape[1] != q.shape[1]
        if backend is None:
            return F.scaled_dot_product_attention(q, k2, v2, is_causal=True, scale=1.0, enable_gqa=gqa)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([getattr(SDPBackend, backend)]):
            return F.scaled_dot_product_attention(q, k2, v2, is_causal=True, scale=1.0, enable_gqa=gqa)
    return run


_FLEX: dict = {}


def flex(q, k, v, window):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, L, _ = q.shape
    key = (L, window)
    if key not in _FLEX:
        def mod(b, h, qi, ki):
            ok = ki <= qi
            return ok & (qi - ki < window) if window else ok
        _FLEX[key] = create_block_mask(mod, None, None, L, L, device=q.device)
    return compiled(flex_attention, dynamic=False)(q, k, v, block_mask=_FLEX[key], scale=1.0,
                                                   enable_gqa=k.shape[1] != H)


def _chunked(q, k, v, window, chunk: int = 1024):
    rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, rep), repeat_kv(v, rep)
    L = q.shape[2]
    outs = []
    for s in range(0, L, chunk):
        e = min(L, s + chunk)
        scores = torch.matmul(q[:, :, s:e], k[:, :, :e].transpose(-1, -2)).float()
        qi = torch.arange(s, e, device=q.device)[:, None]
        ki = torch.arange(e, device=q.device)[None, :]
        ok = ki <= qi
        if window:
            ok = ok & (qi - ki < window)
        p = scores.masked_fill(~ok, float("-inf")).softmax(-1).to(v.dtype)
        outs.append(torch.matmul(p, v[:, :, :e]))
    return torch.cat(outs, dim=2)


def chunked(q, k, v, window):
    return compiled(_chunked, dynamic=False)(q, k, v, window)


def chunked_band(q, k, v, window):
    """align's attention=layered path (align/models/layered_attention.py), compiled as the blocks are."""
    from align.models.layered_attention import chunked_attention

    return compiled(chunked_attention, dynamic=True)(q, k, v, None, 1.0, window=window)


def windowed(q, k, v, window):
    """align's attention=layered path for a sliding layer's unpadded row past its window (the flash
    kernel with the window on CUDA), compiled as the blocks are."""
    from align.models.layered_attention import windowed_attention

    return compiled(windowed_attention, dynamic=True)(q, k, v, 1.0, window).transpose(1, 2)


CANDIDATES = {
    "sliding_attention": {"sdpa_mask": sdpa_mask, "flex": flex, "sdpa_causal": sdpa_backend(None),
                          "layered": chunked_band, "windowed": windowed},
    "full_attention": {"sdpa_causal": sdpa_backend(None), "sdpa_cudnn": sdpa_backend("CUDNN_ATTENTION"),
                       "sdpa_efficient": sdpa_backend("EFFICIENT_ATTENTION"), "flex": flex, "chunked": chunked,
                       "layered": chunked_band},
}


# ------------------------------------------------------------------------------------ measurement


def reference(q, k, v, window) -> torch.Tensor:
    rep = q.shape[1] // k.shape[1]
    mask = band(q.shape[2], window, q.device)[None, None]
    return F.scaled_dot_product_attention(q.float(), repeat_kv(k, rep).float(), repeat_kv(v, rep).float(),
                                          attn_mask=mask, scale=1.0)


def time_one(fn, q, k, v, window, warmup: int, reps: int) -> dict:
    sync = torch.cuda.synchronize if q.is_cuda else (lambda: None)
    t0 = time.perf_counter()
    for _ in range(warmup):
        fn(q, k, v, window).sum().backward()
    sync()
    first = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        fn(q, k, v, window).sum().backward()
        sync()
        times.append(time.perf_counter() - t)
    times.sort()
    return {"fwd_bwd_ms": 1e3 * times[len(times) // 2], "warmup_s": first}


def _leaf(B: int, H: int, L: int, D: int, device, g) -> torch.Tensor:
    return torch.randn(B, H, L, D, device=device, dtype=torch.bfloat16, generator=g).div_(D ** 0.25).requires_grad_()


def measure(shapes: dict, tokens: int, widths: list[int], device, warmup: int, reps: int,
            candidates: Optional[dict] = None) -> list[dict]:
    candidates = CANDIDATES if candidates is None else candidates
    rows = []
    for kind, s in shapes.items():
        for L in widths:
            B = max(1, tokens // L)
            g = torch.Generator(device=device).manual_seed(0)
            q, k = (_leaf(B, h, L, s["head_dim"], device, g) for h in (s["heads"], s["kv_heads"]))
            v = k if s["head_dim"] > 256 else _leaf(B, s["kv_heads"], L, s["head_dim"], device, g)  # k = v: wide layers
            with torch.no_grad():
                ref = reference(q, k, v, s["window"])
            for name, fn in candidates.get(kind, {}).items():
                row = {"layer_type": kind, "candidate": name, "rows": B, "width": L, **s}
                try:
                    with torch.no_grad():
                        row["max_abs_err"] = float((fn(q, k, v, s["window"]).float() - ref).abs().max())
                    row.update(time_one(fn, q, k, v, s["window"], warmup, reps))
                except Exception as e:  # a refusal is a result
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                    row["trace_tail"] = traceback.format_exc().splitlines()[-3:]
                q.grad = k.grad = v.grad = None
                rows.append(row)
                print(json.dumps({k_: row[k_] for k_ in row if k_ != "trace_tail"}), flush=True)
            del q, k, v, ref
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    global BACKEND
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bench/base_gemma4_lora",
                    help="the bench experiment whose model's shapes are timed")
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per micro-batch (rows = tokens // width)")
    ap.add_argument("--widths", default="4096,2048,512")
    ap.add_argument("--only", default="", help="comma-separated candidates to run (default: all)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tiny", action="store_true", help="the experiment's tiny preset on the CPU: measures nothing")
    ap.add_argument("--backend", default="inductor", help="torch.compile's backend for the compiled candidates")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    known = {n for per in CANDIDATES.values() for n in per}
    keep = set(a.only.split(",")) if a.only else known
    if keep - known:  # a misspelt name would otherwise run nothing and say nothing
        ap.error(f"--only: no candidate {', '.join(sorted(keep - known))}; candidates: {', '.join(sorted(known))}")
    BACKEND = a.backend
    config = hf_config(experiment_config(a.model, a.tiny))
    device = torch.device("cuda" if torch.cuda.is_available() and not a.tiny else "cpu")
    shapes = {kind: {k: entry[k] for k in SHAPE_KEYS} for kind, entry in plan(config).items()}
    candidates = {kind: {n: f for n, f in per.items() if n in keep} for kind, per in CANDIDATES.items()}
    rows = measure(shapes, a.tokens, [int(w) for w in a.widths.split(",")], device, a.warmup, a.reps, candidates)
    a.out.write_text(json.dumps({"shapes": shapes, "tokens": a.tokens, "torch": torch.__version__,
                                 "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                                 "backend": a.backend, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
