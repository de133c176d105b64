"""Does torch.compile of OLMoE's decoder blocks pay, once recompiles are out of the way?

transformers' own OlmoeForCausalLM (bf16, grouped_mm experts, sdpa), forward+backward only, no
optimizer (bench/hf_arm.py's hf_moe_fwd_bwd reference), in three forms on one GPU in one process:
  eager        the reference;
  static       each decoder block compiled, one fixed shape (4 x 2048): compile's best case;
  dynamic      each decoder block compiled with dynamic=True, fed a cycle of ragged shapes
               (rows x width at ~8k tokens), against eager on the same cycle.
Per form: tokens/s, the kernel groups of one profiled pass (align.probes.kernels), graphs and graph
breaks (dynamo's counters).

    python bench/moe_blocks.py [--tiny] [--steps 10]     # JSON under $OUT/moe_blocks.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from align.run.manifest import dynamo_counters  # noqa: E402
from bench.common import experiment_config, hf_config  # noqa: E402

MOE = "bench/base_moe"  # the experiment whose model is measured

# ~8k tokens each: the widths of a ragged budget sampler's batches, padded to 8
RAGGED = [(4, 2048), (9, 904), (2, 4096), (21, 392), (3, 2712), (14, 584)]


def groups_of(model, shapes, dev) -> dict:
    from align.probes.kernels import kernel_table, rows_from_events

    acts = [torch.profiler.ProfilerActivity.CPU]
    acts += [torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda" else []
    with torch.profiler.profile(activities=acts) as prof:
        for rows, width in shapes:
            step(model, rows, width, dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
    t = kernel_table(rows_from_events(prof.key_averages()), steps=len(shapes))
    return {"groups_ms_per_pass": {g: round(v["ms"] / len(shapes), 2) for g, v in t.groups.items()},
            "launches_per_pass": round(t.launches_per_step),
            "top": [(round(k["ms"] / len(shapes), 2), k["name"][:90]) for k in t.kernels[:12]]}


def step(model, rows, width, dev) -> None:
    x = torch.randint(3, model.config.vocab_size, (rows, width), device=dev)
    model(input_ids=x, labels=x, use_cache=False).loss.backward()
    model.zero_grad(set_to_none=True)


def timed(model, shapes, steps, dev) -> float:
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    tokens = 0
    sync()
    t = time.perf_counter()
    for i in range(steps):
        rows, width = shapes[i % len(shapes)]
        step(model, rows, width, dev)
        tokens += rows * width
    sync()
    return tokens / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--forms", default="eager,static,dynamic")
    a = ap.parse_args()
    from transformers import OlmoeForCausalLM

    config = hf_config(experiment_config(MOE, a.tiny))
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    fixed = [(4, 2048)] if not a.tiny else [(2, 64)]
    ragged = RAGGED if not a.tiny else [(2, 64), (3, 40), (1, 128)]
    out = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__}
    for form in a.forms.split(","):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()  # per form (reset() keeps them)
        torch.manual_seed(0)
        with dev:
            model = OlmoeForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16)
        model.train()
        if form != "eager":
            for layer in model.model.layers:
                layer.compile(dynamic=form == "dynamic")
        r = {}
        t0 = time.perf_counter()
        for shapes, name in ((fixed, "fixed"), (ragged, "ragged")):
            if form == "static" and name == "ragged":
                continue
            for rows, width in shapes:  # warm-up (compiles)
                step(model, rows, width, dev)
            r[f"{name}_tok_s"] = round(timed(model, shapes, a.steps, dev))
        r["warmup_and_timing_s"] = round(time.perf_counter() - t0, 1)
        r["kernels_fixed"] = groups_of(model, fixed, dev)
        r["dynamo"] = dynamo_counters()[0]  # what a run's manifest records
        if dev.type == "cuda":
            r["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
            torch.cuda.reset_peak_memory_stats()
        out[form] = r
        print(form, json.dumps(r), flush=True)
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    for form in ("static", "dynamic"):
        if form in out and "eager" in out:
            for k in ("fixed_tok_s", "ragged_tok_s"):
                if k in out[form]:
                    print(f"{form} {k}: {out[form][k] / out['eager'][k]:.3f}x eager")
    dest = Path(os.environ.get("OUT", "outputs/bench")) / "moe_blocks.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
