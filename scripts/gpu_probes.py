"""The scaling and kernels probes on a ~1B Mistral shape and an OLMoE-1B-7B shape, one GPU, one command.

    python3 scripts/gpu_probes.py            # results under $OUT (default outputs/gpu)
    python3 scripts/gpu_probes.py --smoke    # the same four runs at tiny sizes (CPU is fine): shakes out bugs

Random init, bf16 parameters (bf16 autocast), the bundled GSM8K as the real length distribution.
Each probe runs as `python -m align.tools.probe` in its own process (a fresh CUDA context per run) with
hydra.run.dir=$OUT/<run>; this script then gathers the headline numbers into $OUT/summary.json and
prints them. Shapes:

  mistral_1b: vocab 32000, hidden 2048, intermediate 5632, 16 layers, 16 heads, 8 KV heads (~1.1B)
  olmoe:      OLMoE-1B-7B dims (vocab 50304, hidden 2048, expert FFN 1024, 64 experts top-8,
              16 heads) with 8 of its 16 layers to keep the run short
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

MODELS = {
    "mistral_1b": ["model=mistral", "+model.overrides.vocab_size=32000", "+model.overrides.hidden_size=2048",
                   "+model.overrides.intermediate_size=5632", "+model.overrides.num_hidden_layers=16",
                   "+model.overrides.num_attention_heads=16", "+model.overrides.num_key_value_heads=8",
                   "+model.overrides.max_position_embeddings=8192"],
    "olmoe": ["model=olmoe", "+model.overrides.vocab_size=50304", "+model.overrides.hidden_size=2048",
              "+model.overrides.intermediate_size=1024", "+model.overrides.num_hidden_layers=8",
              "+model.overrides.num_attention_heads=16", "+model.overrides.num_key_value_heads=16",
              "+model.overrides.num_experts=64", "+model.overrides.num_experts_per_tok=8",
              "+model.overrides.max_position_embeddings=4096"],
}
PROBES = {
    ("mistral_1b", "scaling"): ["probe.scaling.lengths=[1024,2048,4096,8192]", "probe.scaling.batch_size=2",
                                "probe.scaling.warmup=2", "probe.scaling.repeats=3"],
    ("olmoe", "scaling"): ["probe.scaling.lengths=[512,1024,2048,4096]", "probe.scaling.batch_size=2",
                           "probe.scaling.warmup=2", "probe.scaling.repeats=3"],
    # 16 rows of GSM8K (~165 tokens each, padded per micro-batch): small enough to show launch cost
    ("mistral_1b", "kernels"): ["probe.kernels.steps=5", "sampler.micro_batch_size=16"],
    ("olmoe", "kernels"): ["probe.kernels.steps=5", "sampler.micro_batch_size=16"],
}
# logger=none: no wandb on the GPU machine. allow_dirty: the copied tree may carry untracked wheels.
COMMON = ["logger=none", "allow_dirty=true", "model.dtype=bfloat16"]
SMOKE_MODELS = {  # tiny sizes that run anywhere, through the same code path
    "mistral_1b": ["model=mistral", "data.max_records=64"],
    "olmoe": ["model=olmoe", "data.max_records=64"],
}
SMOKE_PROBES = {
    "scaling": ["probe.scaling.lengths=[32,64,128]", "probe.scaling.warmup=1", "probe.scaling.repeats=1",
                "probe.scaling.measure_steps=1"],
    "kernels": ["probe.kernels.warmup=1", "probe.kernels.timed_steps=1", "probe.kernels.steps=1"],
}


def overrides(model: str, probe: str, smoke: bool) -> list[str]:
    if smoke:
        return [f"probe={probe}", *COMMON, *SMOKE_MODELS[model], *SMOKE_PROBES[probe]]
    return [f"probe={probe}", *COMMON, *MODELS[model], *PROBES[(model, probe)]]


def headline(run: str, d: Path) -> dict:
    """The numbers to quote from one run dir."""
    if (d / "scaling.json").exists():
        r = json.loads((d / "scaling.json").read_text())
        a, pr, me = r["analysis"], r["prediction"], r["measured"]
        f = a["two_term"] if a["used"] == "two_term" else a["three_term"]
        return {
            "model": r["model"]["model_class"], "attn": r["model"]["attn_implementation_resolved"],
            "experts": r["model"].get("experts_implementation_resolved"), "device": r["model"]["device_name"],
            "points_ms": {p["w"]: None if p["oom"] else round(p["best_s"] * 1e3, 3) for p in r["points"]},
            "A_s_per_token": f["A"], "B_s_per_token2": f["B"], "C_s": f["C"], "fit_used": a["used"],
            "max_abs_residual_two_term": a["two_term"]["max_abs_rel_residual"],
            "quadratic_share": f["quadratic_share"], "regime": a["regime"], "confirmed": a["confirmed"],
            "constant_check": a["constant_check"], "messages": a["messages"],
            "predicted_step_s": pr["step_s_predicted_plus_measured_overhead"], "measured_step_s": me["step_s_mean"],
            "fwd_bwd_measured_over_predicted": me["fwd_bwd_measured_over_predicted"],
            "ce_forward_fraction_of_step": me["ce_forward_fraction_of_step"], "throughput": me["throughput"],
        }
    r = json.loads((d / "kernels.json").read_text())
    t = r["kernel_table"]
    return {
        "model": r["model"]["model_class"], "attn": r["model"]["attn_implementation_resolved"],
        "experts": r["model"].get("experts_implementation_resolved"), "device": r["model"]["device_name"],
        "groups_ms_pct": {g: (round(v["ms"], 3), round(v["pct"], 4)) for g, v in t["groups"].items()},
        "kernel_total_over_wall": t["wall_ratio"], "wall_ok": t["wall_ok"],
        "launches_per_step": t["launches_per_step"], "old_arch": [(k["arch"], k["name"][:100]) for k in t["old_arch"]],
        "fallback": [k["name"][:100] for k in t["fallback"]], "top5": [(round(k["ms"], 3), k["group"], k["name"][:100])
                                                                      for k in t["kernels"][:5]],
        "throughput": r["throughput_unprofiled"], "ceiling": r["throughput_convention"]["ceiling"],
        "datasheet": r["throughput_convention"]["datasheet_source"], "reason": r.get("reason"),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, any device: check the mechanics")
    ap.add_argument("--only", default=None, help="run only runs whose name contains this (e.g. mistral_1b)")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT", "outputs/gpu"))
    out.mkdir(parents=True, exist_ok=True)
    summary, failed = {}, []
    for (model, probe) in PROBES:
        run = f"{probe}_{model}"
        if args.only and args.only not in run:
            continue
        cmd = [sys.executable, "-m", "align.tools.probe", *overrides(model, probe, args.smoke),
               f"hydra.run.dir={out / run}"]
        print(f"\n=== {run}: {' '.join(cmd[1:])}", flush=True)
        shutil.rmtree(out / run, ignore_errors=True)  # this OUT's previous result: a probe never writes over a run
        t0 = time.time()
        p = subprocess.run(cmd)
        print(f"=== {run}: exit {p.returncode} in {time.time() - t0:.0f} s", flush=True)
        if p.returncode != 0:
            failed.append(run)
            continue
        summary[run] = {"wall_s": round(time.time() - t0, 1), **headline(run, out / run)}
    summary["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    summary["failed"] = failed
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(json.dumps(summary, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
