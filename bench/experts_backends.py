"""Which experts kernel serves Gemma-4 26B-A4B's MoE layer best on this GPU?

transformers' own experts module of the composed model (`Gemma4TextExperts`: 128 experts, top-8,
hidden 2,816, expert width 704 at the full preset), its weights frozen as under LoRA (the adapters
sit on the dense `nn.Linear`s, the fused expert tensors are no `nn.Linear`), so backward computes
the input's gradient only. Per backend (`config._experts_implementation`: grouped_mm, batched_mm,
eager) and token count: forward + backward time, its spread, the peak memory above the weights, and
the output's distance from the eager loop's (the reference). Routing is a softmax top-k over random
scores with the router's normalisation, the near-uniform load of the randomly initialised bench
model. grouped_mm and batched_mm also run compiled (`torch.compile`, dynamic shapes), as the
compiled decoder blocks run them; eager's loop over the experts it finds (`nonzero`) breaks a graph
at every expert, so it runs eagerly only.

    python bench/experts_backends.py [--tiny] [--tokens 2048,8192]   # JSON under $OUT/experts_backends.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import experiment_config, hf_config  # noqa: E402

EXPERIMENT = "bench/gemma4_lora_noac"
BACKENDS = ("grouped_mm", "batched_mm", "eager")
COMPILED = ("grouped_mm", "batched_mm")


def experts_module(config, dev: torch.device, dtype: torch.dtype):
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextExperts

    torch.manual_seed(0)
    with dev:
        m = Gemma4TextExperts(config).to(dtype)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=config.initializer_range)
        p.requires_grad_(False)
    return m


def routing(config, tokens: int, dev: torch.device):
    g = torch.Generator(device=dev).manual_seed(1)
    probs = torch.randn(tokens, config.num_experts, device=dev, generator=g).softmax(-1)
    weights, index = torch.topk(probs, config.top_k_experts, dim=-1)
    return weights / weights.sum(-1, keepdim=True), index


def one_pass(fn, x, index, weights, grad) -> torch.Tensor:
    x.grad = None
    out = fn(x, index, weights)
    out.backward(grad)
    return out


def measure(module, backend: str, compiled: bool, tokens: int, config, dev, dtype, warmup: int, reps: int,
            reference: Optional[torch.Tensor]) -> dict:
    module.config._experts_implementation = backend
    fn = torch.compile(module, dynamic=True) if compiled else module
    x = torch.randn(tokens, config.hidden_size, device=dev, dtype=dtype, generator=torch.Generator(dev).manual_seed(2))
    x.requires_grad_(True)
    weights, index = routing(config, tokens, dev)
    grad = torch.randn_like(x)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    row = {"backend": backend, "compiled": compiled, "tokens": tokens}
    try:
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        for _ in range(warmup):
            out = one_pass(fn, x, index, weights, grad)
        sync()
        row["warmup_s"] = round(time.perf_counter() - t0, 2)
        times = []
        for _ in range(reps):
            sync()
            t = time.perf_counter()
            out = one_pass(fn, x, index, weights, grad)
            sync()
            times.append(time.perf_counter() - t)
    except torch.OutOfMemoryError as e:
        row["error"] = f"out of memory: {str(e).splitlines()[0][:160]}"
        return row
    row["ms_median"] = round(statistics.median(times) * 1e3, 3)
    row["ms_min"] = round(min(times) * 1e3, 3)
    row["ms_max"] = round(max(times) * 1e3, 3)
    if dev.type == "cuda":
        row["peak_gib_above_weights"] = round((torch.cuda.max_memory_allocated() - base) / 2**30, 2)
    if reference is not None:
        scale = reference.float().abs().max().item() or 1.0
        row["max_rel_err_vs_eager"] = float((out.detach().float() - reference).abs().max().item() / scale)
    row["_out"] = out.detach().float()
    return row


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true",
                    help="the tiny preset on the CPU: checks the bench, measures nothing")
    ap.add_argument("--tokens", default="2048,8192", help="comma-separated routed token counts (before top-k)")
    ap.add_argument("--backends", default=",".join(BACKENDS),
                    help="comma-separated backends besides the eager reference, which always runs first")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-compile", action="store_true", help="eager forms only")
    ap.add_argument("--out", default=None, help="the JSON (default $OUT/experts_backends.json)")
    a = ap.parse_args(argv)
    backends = [b for b in a.backends.split(",") if b]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown or not backends:
        print(f"--backends {a.backends}: accepted: a comma-separated subset of {','.join(BACKENDS)}", file=sys.stderr)
        return 2
    token_counts = [int(t) for t in a.tokens.split(",") if t]
    config = hf_config(experiment_config(EXPERIMENT, a.tiny))
    config = getattr(config, "text_config", config)
    dev = torch.device("cuda" if torch.cuda.is_available() and not a.tiny else "cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    module = experts_module(config, dev, dtype)
    shape = {"experts": config.num_experts, "top_k": config.top_k_experts, "hidden": config.hidden_size,
             "expert_width": config.moe_intermediate_size}
    out = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "dtype": str(dtype), "shape": shape, "rows": []}
    print("experts:", json.dumps(shape), flush=True)
    for tokens in token_counts:
        reference = None  # the eager loop's output, first at every token count
        forms = [("eager", False), *[(b, False) for b in backends if b != "eager"]]
        forms += [] if a.no_compile else [(b, True) for b in backends if b in COMPILED]
        for backend, compiled in forms:
            torch._dynamo.reset()
            row = measure(module, backend, compiled, tokens, config, dev, dtype, a.warmup, a.reps, reference)
            got = row.pop("_out", None)
            if reference is None:
                reference = got
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
    dest = Path(a.out) if a.out else Path(os.environ.get("OUT", "outputs/bench")) / "experts_backends.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
