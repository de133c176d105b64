"""The optimizer's pass alone, at OLMoE-1B-7B's parameter shapes (bf16, one GPU): torch's fused AdamW
(what align runs) against a torch.compile'd foreach AdamW, and the gradient-norm variants. Prints ms per
call and the memory traffic rate; no model forward.

    python bench/optim_kernels.py [--tiny]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import experiment_config, hf_config  # noqa: E402

MOE = "bench/base_moe"  # the experiment whose model is measured


def timed(fn, reps: int, sync) -> float:
    fn()
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t) / reps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    from transformers import OlmoeForCausalLM

    config = hf_config(experiment_config(MOE, a.tiny))
    with torch.device("meta"):
        shapes = [p.shape for p in OlmoeForCausalLM._from_config(config).parameters()]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)
    n = sum(s.numel() for s in shapes)
    print(f"{len(shapes)} tensors, {n / 1e9:.2f} B parameters, bf16, {dev}", flush=True)
    ps = [torch.nn.Parameter(torch.randn(s, device=dev, dtype=torch.bfloat16) * 0.02) for s in shapes]
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-3
    grads = [p.grad for p in ps]
    traffic = n * 14  # bf16: read param, grad, two moments; write param, two moments

    res = {}
    res["norm fp64 foreach"] = timed(lambda: torch._foreach_norm(grads, 2.0, dtype=torch.float64), a.reps, sync)
    res["norm fp32 foreach"] = timed(lambda: torch._foreach_norm(grads, 2.0, dtype=torch.float32), a.reps, sync)
    res["norm fp32 foreach, fp64 combine"] = timed(lambda: torch.linalg.vector_norm(
        torch.stack(torch._foreach_norm(grads, 2.0, dtype=torch.float32)).double()), a.reps, sync)

    kw = {"lr": 1e-5, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0}
    opt = torch.optim.AdamW(ps, fused=dev.type == "cuda", **kw)
    if dev.type == "cuda":
        opt.grad_scale = torch.tensor(1.5, device=dev)
    res["fused AdamW (align)"] = timed(opt.step, a.reps, sync)
    del opt
    torch.cuda.empty_cache() if dev.type == "cuda" else None

    # a tensor lr keeps a schedule from recompiling; torch wants capturable=True for it with foreach
    cuda = dev.type == "cuda"
    opt = torch.optim.AdamW(ps, foreach=True, capturable=cuda, **{**kw, "lr": torch.tensor(1e-5) if cuda else 1e-5})
    step = torch.compile(opt.step)
    t = time.perf_counter()
    step()
    sync()
    compile_s = time.perf_counter() - t
    res["compiled foreach AdamW"] = timed(step, a.reps, sync)
    print(f"compiled AdamW: first call (compile) {compile_s:.1f} s", flush=True)
    for k, ms in res.items():
        rate = f"{traffic / ms / 1e9:.2f} TB/s" if "AdamW" in k else f"{n * 2 / ms / 1e9:.2f} TB/s read"
        print(f"{k:>34}: {ms:8.2f} ms  ({rate})", flush=True)


if __name__ == "__main__":
    main()
