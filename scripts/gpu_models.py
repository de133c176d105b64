"""GPU evidence for the model families: one short `small`-preset training run per family through the
real entry path (preflight -> Trainer.build -> fit), printing what resolved, router telemetry, step
time, and peak memory beside preflight's estimate. Results: $OUT/models_small_runs.json (default
./outputs/gpu) plus each run dir (history.jsonl, plots/moe_expert_load.png) under $OUT/runs/.

    python scripts/gpu_models.py                        # H200: 4 families x 20 steps, ~2-3 min
    python scripts/gpu_models.py --preset tiny --steps 2 --device cpu   # CPU shake-out
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def run_family(family: str, args, out: Path) -> dict:
    import torch

    from align.config import to_typed
    from align.parallel.env import resolve_device
    from align.plan.budget_auto import plan_budget
    from align.plan.memory import estimate_memory
    from align.run.cli import compose
    from align.run.preflight_checks import run_preflight
    from align.telemetry.history import read_history
    from align.trainer import Trainer

    run_dir = out / "runs" / f"{family}-{args.preset}"
    overrides = [f"model={family}", f"model.preset={args.preset}", "logger=none", f"trainer.max_steps={args.steps}",
                 "trainer.export=false", "allow_dirty=true", f"trainer.device={args.device}", "trainer.log_every=5",
                 f"data.max_seq_len={args.seq}", f"sampler.micro_batch_size={args.batch}",
                 f"data.max_records={args.records}", "sampler=bucket", *args.extra]
    cfg = to_typed(compose(overrides))
    print(f"\n=== {family} ({' '.join(overrides)})", flush=True)
    t0 = time.time()
    checks = run_preflight(cfg)
    for c in checks:
        print(f"  preflight: {c.name}: {c.detail}")
    device = resolve_device(cfg.trainer.device)
    est = estimate_memory(plan_budget(cfg, device)[0], device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer.build(cfg, run_dir)
    trainer.fit()
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    rows = read_history(run_dir / "history.jsonl")
    last = rows[-1]
    moe = {k: v for k, v in last.items() if k.startswith("moe/") and k.count("/") == 1}
    info = trainer.model_info
    res = {
        "family": family, "overrides": overrides, "wall_s": time.time() - t0,
        "model_class": info["model_class"], "params_total": info["params_total"],
        "params_active": info["params_active"],
        "attn": [info["attn_implementation_requested"], info["attn_implementation_resolved"]],
        "experts": [info["experts_implementation_requested"], info["experts_implementation_resolved"]],
        "loss_first": rows[0]["loss"], "loss_last": last["loss"],
        "step_time_median_s": statistics.median(r["step_time_s"] for r in rows[1:] or rows),
        "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rows[1:] or rows),
        "memory_estimate_gib": est.total / 2**30, "memory_estimate": est.as_dict(),
        "peak_allocated_gib": None if peak is None else peak / 2**30,
        "telemetry_last_step": moe,
        "telemetry_per_layer_last_step": {k: v for k, v in last.items() if re.match(r"moe/l\d+/", k)},
        "heatmap": info.get("moe_heatmap"), "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
    }
    print(f"  resolved: attn {res['attn'][1]} (asked {res['attn'][0]}), "
          f"experts {res['experts'][1]} (asked {res['experts'][0]}); "
          f"params {res['params_total'] / 1e6:.1f}M ({res['params_active'] / 1e6:.1f}M active)")
    print(f"  loss {res['loss_first']:.3f} -> {res['loss_last']:.3f}; "
          f"step {res['step_time_median_s'] * 1e3:.0f} ms median; "
          f"{res['tokens_per_s_median']:,.0f} tok/s")
    if peak is not None:
        print(f"  memory: estimate {res['memory_estimate_gib']:.2f} GiB "
              f"vs peak allocated {res['peak_allocated_gib']:.2f} GiB")
    if moe:
        print("  telemetry (step %d): " % last["step"]
              + ", ".join(f"{k.removeprefix('moe/')} {v:.3f}" for k, v in moe.items()))
        for layer in sorted({int(k.split("/")[1][1:]) for k in res["telemetry_per_layer_last_step"]}):
            p = f"moe/l{layer}/"
            print(f"    l{layer}: max_vio {last[p + 'max_vio']:.2f} util {last[p + 'utilization']:.3f} "
                  f"dead {last[p + 'dead_frac']:.3f} "
                  f"entropy {last[p + 'entropy']:.3f} lb {last[p + 'lb_loss']:.3f} z {last[p + 'z_loss']:.3f}")
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="mistral,olmoe,gemma4,gemma4_moe")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("extra", nargs="*", help="more Hydra overrides for every run")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT", "outputs/gpu"))
    out.mkdir(parents=True, exist_ok=True)
    results, failures = [], []
    for fam in args.families.split(","):
        try:
            results.append(run_family(fam, args, out))
        except Exception as e:  # record and go on: one family's failure must not hide the others
            import traceback

            traceback.print_exc()
            failures.append({"family": fam, "error": f"{type(e).__name__}: {e}"})
    (out / "models_small_runs.json").write_text(
        json.dumps({"runs": results, "failures": failures}, indent=1, default=str))
    print(f"\nwrote {out / 'models_small_runs.json'}; {len(results)} ok, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
