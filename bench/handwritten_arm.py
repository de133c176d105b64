"""A reference arm that is not HF: a hand-written training loop over the dense bench model on ideal data.

  handwritten     the dense bench model (base_dense's transformers config, fp32 weights), rows of exactly
                  2048 tokens (no padding, no mask), as many per step as dense_best's token budget holds,
                  each decoder layer torch.compile'd for that one shape, flash-first SDPA, fused AdamW,
                  bf16 autocast, clip 1.0, constant lr; one optimizer step per micro-batch

It is what a strong engineer writes by hand when the data is already uniform: the bar align's ragged-data
runs are held against in the same command.

    python bench/handwritten_arm.py --arm handwritten --steps 30 --warmup 8 --out m.json [--tiny]

Writes the raw measurement (bench.common.measurement) to --out; bench/run.py derives rates and MFU.
--tiny: the experiment's CPU-sized preset, short rows, dynamo's eager backend: checks the code path,
measures nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import (  # noqa: E402
    experiment_config,
    hf_config,
    measurement,
    model_class,
    token_rows,
    useful_flops_per_token,
)

REFERENCE_ARMS = {"handwritten": "bench/base_dense"}
"""reference arm -> the align experiment whose model it builds."""
BUDGET_ARM = "bench/dense_best"
"""Whose tokens per micro-batch the loop steps on (rows of WIDTH, as many as its budget holds)."""
DATA_FILE, DATA_FLAG = "rows.jsonl", "--rows-file"
"""The harness hands every reference arm its rows file; this arm makes its own uniform rows instead."""
WIDTH, WIDTH_TINY = 2048, 128


def shape(tiny: bool) -> tuple[int, int]:
    """(rows, width) of every step."""
    width = WIDTH_TINY if tiny else WIDTH
    return max(experiment_config(BUDGET_ARM).sampler.max_tokens // WIDTH, 1), width


def sdpa_flash_first(cuda: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return sdpa_kernel(order if cuda else [SDPBackend.MATH])


def handwritten_arm(arm: str, typed, steps: int, warmup: int, tiny: bool) -> dict:
    from align.telemetry.throughput import ModelFlops

    cuda = torch.cuda.is_available() and not tiny
    dev = torch.device("cuda" if cuda else "cpu")
    config = hf_config(typed)
    torch.manual_seed(typed.trainer.seed)
    with dev:
        model = model_class(typed)._from_config(config, attn_implementation="sdpa")
    model.train()
    for layer in model.model.layers:  # fixed shape: one static graph per layer class
        layer.compile(backend="inductor" if cuda else "eager", dynamic=False)
    opt = torch.optim.AdamW(model.parameters(), lr=typed.optimizer.lr, betas=tuple(typed.optimizer.betas),
                            eps=typed.optimizer.eps, weight_decay=typed.optimizer.weight_decay, fused=cuda)
    rows, width = shape(tiny)
    data = torch.from_numpy(np.stack(token_rows(np.full(rows * steps, width, dtype=np.int64), config.vocab_size)))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    marks = []
    for s in range(steps):
        x = data[s * rows:(s + 1) * rows].to(dev, non_blocking=True)
        with autocast, sdpa_flash_first(cuda):
            loss = model(input_ids=x, labels=x, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), typed.optimizer.max_grad_norm, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        marks.append(time.perf_counter())
        if not torch.isfinite(loss.detach()):
            raise SystemExit(f"bench/handwritten_arm.py: step {s + 1}: the loss is {loss.item()}")
    flops = ModelFlops.from_model(model)
    n = steps - warmup
    tokens = rows * width * n
    fpt = useful_flops_per_token(flops, np.full(rows, width))
    return measurement(arm, marks[-1] - marks[warmup - 1], n, tokens, tokens, flops.per_batch(rows, width) * n,
                       tokens * fpt, torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                       attn=model.config._attn_implementation, rows=rows, width=width,
                       final_loss=float(loss.detach()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", required=True, choices=sorted(REFERENCE_ARMS))
    ap.add_argument("--steps", type=int, default=30, help="steps in all, the warm-up included")
    ap.add_argument("--warmup", type=int, default=8, help="first steps not measured (they compile)")
    ap.add_argument("--tiny", action="store_true", help="the experiment's tiny preset on the CPU: measures nothing")
    ap.add_argument(DATA_FLAG, type=Path, help="accepted for the harness; this arm makes its own uniform rows")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if not 1 <= a.warmup < a.steps:
        raise SystemExit(f"bench/handwritten_arm.py: --warmup {a.warmup} must be >= 1 and below --steps {a.steps}")
    m = handwritten_arm(a.arm, experiment_config(REFERENCE_ARMS[a.arm], a.tiny), a.steps, a.warmup, a.tiny)
    a.out.write_text(json.dumps(m, indent=1))
    print(json.dumps(m))


if __name__ == "__main__":
    main()
