"""OLMoE-1B-7B at full size on one GPU: transformers' own model, forward+backward only (the
reference), against align's WHOLE training step (data, optimizer, logging) at the same tokens per
step, and align with activation checkpointing + chunked loss letting micro-batches grow.

    python bench/moe.py [--steps 30] [--tiny]     # results under $OUT/moe (default outputs/bench/moe)

MFU is on ACTIVE parameters (align.telemetry.throughput's convention: experts x top_k/num_experts).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import bimodal_lengths, matmul_ceiling_tflops, parse_defines, profile_kernels, token_rows, write_rows  # noqa: E402

ALIGN_ARMS = {
    # one micro-batch per optimizer step, budget 8192 tokens: the reference's tokens per step as a cap
    "align_step_8k": ["sampler.max_tokens=8192"],
    # the same with the budget raised until the MEAN real tokens per step is ~8192 (ragged rows leave
    # a fixed budget ~10% empty), padded to 8
    "align_step_fill": ["sampler.max_tokens=9216", "sampler.pad_to_multiple_of=8"],
    # 8192-token micro-batches, optimizer every 4: the optimizer's pass over 6.9 B parameters amortised
    "align_accum4": ["sampler.max_tokens=9216", "sampler.pad_to_multiple_of=8", "trainer.grad_accum=4"],
    "align_8bit": ["sampler.max_tokens=9216", "sampler.pad_to_multiple_of=8", "optimizer=adamw8bit"],
    # the optimizer on a side stream, overlapping the next forward block by block (bit-identical)
    "align_overlap": ["sampler.max_tokens=9216", "sampler.pad_to_multiple_of=8", "optimizer.overlap=true"],
    # torch.compile of torch's AdamW and of the gradient norm (the best one-step-per-8k arm, 2026-11-30)
    "align_compiled": ["sampler.max_tokens=9216", "sampler.pad_to_multiple_of=8", "optimizer.compile=true"],
    "align_overlap_compiled": ["sampler.max_tokens=9216", "sampler.pad_to_multiple_of=8", "optimizer.overlap=true", "optimizer.compile=true"],
    "align_compiled_accum8": ["sampler.max_tokens=9216", "sampler.pad_to_multiple_of=8", "optimizer.compile=true",
                              "trainer.grad_accum=8"],
    "align_no_telemetry": ["sampler.max_tokens=9216", "sampler.pad_to_multiple_of=8", "model.moe.telemetry=false"],
    # compiled decoder blocks (one dynamic graph for every ragged shape) + the compiled optimizer:
    # the best one-step-per-8.5k arm (2026-11-30, session 4)
    "align_fast": ["sampler.max_tokens=9216", "sampler.pad_to_multiple_of=8", "trainer.compile=true",
                   "trainer.compile_dynamic=true", "optimizer.compile=true"],
    # activation checkpointing + chunked loss: 4x the tokens per micro-batch
    "align_ac_32k": ["sampler.max_tokens=32768", "sampler.pad_to_multiple_of=8", "parallel.activation_checkpointing=true",
                     "trainer.loss_chunk_tokens=8192"],
    # the best MFU arm: AC on 4 of 16 blocks, compiled optimizer
    "align_ac_32k_quarter": ["sampler.max_tokens=32768", "sampler.pad_to_multiple_of=8", "parallel.activation_checkpointing=true",
                             "parallel.activation_checkpointing_fraction=0.25", "trainer.loss_chunk_tokens=8192",
                             "optimizer.compile=true"],
    # the same with compiled decoder blocks: the best MFU arm (2026-11-30, session 4)
    "align_ac_32k_fast": ["sampler.max_tokens=32768", "sampler.pad_to_multiple_of=8", "parallel.activation_checkpointing=true",
                          "parallel.activation_checkpointing_fraction=0.25", "trainer.loss_chunk_tokens=8192",
                          "optimizer.compile=true", "trainer.compile=true", "trainer.compile_dynamic=true"],
}


def olmoe_config(tiny: bool):
    from align.cli import compose
    from align.config import to_typed
    from align.models.build import model_config

    cfg = to_typed(compose(["model=olmoe", f"model.preset={'tiny' if tiny else 'full'}"]))
    return model_config(cfg.model, vocab_size=None if not tiny else 512), cfg


def reference(tiny: bool, steps: int, warmup: int, rows: int, width: int, ceiling: float) -> dict:
    """transformers' OlmoeForCausalLM, bf16, default experts kernel, fwd+bwd only, no optimizer."""
    from transformers import OlmoeForCausalLM

    from align.telemetry.throughput import ModelFlops

    config, _ = olmoe_config(tiny)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with dev:
        model = OlmoeForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16)
    model.train()
    x = torch.randint(3, config.vocab_size, (rows, width), device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(warmup + steps):
        sync()
        t = time.perf_counter()
        model(input_ids=x, labels=x, use_cache=False).loss.backward()
        model.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t)
    sec = sum(times[warmup:]) / steps
    flops = ModelFlops.from_model(model).per_batch(rows, width)
    return {"arm": "hf_fwd_bwd_only", "tokens_per_step": rows * width, "real_tokens_per_s": rows * width / sec,
            "mfu_active": flops / sec / 1e12 / ceiling, "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None,
            "experts_implementation": model.config._experts_implementation, "attn": model.config._attn_implementation}


def align_overrides(rows_file: Path, out: Path, steps: int, tiny: bool) -> list[str]:
    return ["model=olmoe", f"model.preset={'tiny' if tiny else 'full'}",
            "model.dtype=bfloat16", "data=tokens", f"data.path={rows_file}", "data.max_seq_len=4096",
            f"data.cache_dir={out / 'cache'}", "sampler=budget", "sampler.bucket_size=100000", "sampler.pad_to_multiple_of=64",
            "logger=none", "trainer.export=false", f"trainer.max_steps={steps}", "optimizer.lr=1e-5",
            "optimizer.warmup_ratio=0", "trainer.log_every=5", "allow_dirty=true", "model.allow_over_memory=true",
            "sampler.mask_padding=false", "model.init_on_device=true"]


def run_align(arm: str, extra: list[str], rows_file: Path, out: Path, steps: int, warmup: int, tiny: bool, env) -> dict:
    run_dir = out / "runs" / arm
    cmd = [sys.executable, "-m", "align.train", *align_overrides(rows_file, out, steps, tiny), *extra, f"hydra.run.dir={run_dir}"]
    with (out / f"{arm}.log").open("w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        tail = (out / f"{arm}.log").read_text().strip().splitlines()[-1:] or [""]
        return {"arm": arm, "error": f"exit {rc}: {tail[0][:300]}"}
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    m = rows[warmup:]
    sec = m[-1]["elapsed_s"] - rows[warmup - 1]["elapsed_s"]
    real = sum(r["real_tokens"] for r in m)
    tflops = sum(r["model_flops"] for r in m) / sec / 1e12
    prov = json.loads((run_dir / "provenance.json").read_text())
    return {"arm": arm, "tokens_per_step": sum(r["tokens"] for r in m) / len(m), "real_tokens_per_s": real / sec,
            "padding_waste": 1 - real / sum(r["tokens"] for r in m), "achieved_tflops_padded": tflops,
            "mfu_active": tflops / (prov["throughput"].get("throughput/ceiling_tflops") or float("nan")),
            "peak_mem_gib": max((r.get("mem_peak_gib") or 0) for r in rows),
            "step_ms": [round(r["step_time_s"] * 1000) for r in m], "alloc_retries": rows[-1].get("mem_alloc_retries"),
            "experts_implementation": prov["model"].get("experts_implementation_resolved"),
            "optimizer": (prov["model"].get("extra") or {}).get("optimizer_impl"),
            "optimizer_step": ((prov["model"].get("extra") or {}).get("optimizer_step") or {}).get("kind"),
            "dynamo": prov.get("dynamo")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--arms", default="ref," + ",".join(ALIGN_ARMS))
    ap.add_argument("--define", action="append", default=[], metavar="NAME='OVERRIDES'",
                    help="an extra align arm: NAME='ov1 ov2 ...' (then name it in --arms)")
    ap.add_argument("--profile", default="", help="comma-separated align arms whose kernel table to print after the arms")
    a = ap.parse_args()
    ALIGN_ARMS.update(parse_defines(a.define))
    out = Path(os.environ.get("OUT", "outputs/bench")).resolve() / "moe"
    out.mkdir(parents=True, exist_ok=True)
    ceiling = matmul_ceiling_tflops()
    config, _ = olmoe_config(a.tiny)
    rows_file = out / "bimodal_rows.jsonl"
    write_rows(rows_file, token_rows(bimodal_lengths(3000), config.vocab_size))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    results = []
    for arm in a.arms.split(","):
        t0 = time.time()
        if arm == "ref":
            r = reference(a.tiny, 10, 3, 4, 2048 if not a.tiny else 128, ceiling)
        else:
            r = run_align(arm, ALIGN_ARMS[arm], rows_file, out, a.steps, a.warmup, a.tiny, env)
        r["wall_s"] = round(time.time() - t0, 1)
        results.append(r)
        print(json.dumps(r), flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    ref = next((r for r in results if r["arm"] == "hf_fwd_bwd_only"), None)
    for r in results:
        if ref and "real_tokens_per_s" in r:
            r["vs_reference"] = r["real_tokens_per_s"] / ref["real_tokens_per_s"]
    (out / "moe.json").write_text(json.dumps({"ceiling_tflops": ceiling, "results": results}, indent=1))
    print(f"ceiling {ceiling:.0f} TFLOP/s")
    for r in results:
        print(f"{r['arm']:>18}  {r.get('real_tokens_per_s', float('nan')):>10,.0f} tok/s  "
              f"MFU(active) {r.get('mfu_active', float('nan')):.1%}  peak {r.get('peak_mem_gib') or float('nan'):.1f} GiB  "
              f"vs ref {r.get('vs_reference', float('nan')):.2f}x  {r.get('error', '')}")
        if r.get("step_ms"):
            print(f"{'':>20}tokens/step {r['tokens_per_step']:,.0f}; step ms {r['step_ms']}; allocator retries {r['alloc_retries']}")
    for arm in filter(None, a.profile.split(",")):
        profile_kernels([*align_overrides(rows_file, out, a.steps, a.tiny), *ALIGN_ARMS[arm]], out, arm, env)


if __name__ == "__main__":
    main()
