"""Data-parallel scaling of the dense bench model: align's best configuration on one GPU against
parallel=fsdp on two (launchers/torchrun.sh), the same micro-batches per GPU. Target: per-GPU
throughput on two GPUs >= 0.92x one GPU.

    python bench/two_gpu.py [--steps 50]        # results under $OUT (default outputs/bench)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import MODEL, TINY, bimodal_lengths, matmul_ceiling_tflops, token_rows, useful_flops_per_token, write_rows  # noqa: E402
from bench.run import ALIGN_ARMS, run_align  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--arm", default="align_eager", choices=sorted(ALIGN_ARMS))  # the arm of the measured two-GPU ratio
    ap.add_argument("--variant", action="append", default=[], metavar="'OVERRIDES'",
                    help="another two-GPU run with these extra overrides, e.g. 'parallel.reshard_after_forward=false'")
    a = ap.parse_args()
    out = Path(os.environ.get("OUT", "outputs/bench")).resolve() / "two_gpu"
    out.mkdir(parents=True, exist_ok=True)
    cfg = TINY if a.tiny else MODEL
    lengths = bimodal_lengths(8000)
    rows_file = out / "bimodal_rows.jsonl"
    write_rows(rows_file, token_rows(lengths, cfg["vocab_size"]))
    fpt, ceiling = useful_flops_per_token(cfg, lengths), matmul_ceiling_tflops()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env["PYTHON"] = sys.executable  # launchers/torchrun.sh runs $PYTHON
    device = ["trainer.device=cpu"] if a.tiny else []
    one = run_align("one_gpu", ALIGN_ARMS[a.arm] + device, cfg, rows_file, out, a.steps, a.warmup, fpt, ceiling, env)
    launcher = ["bash", str(ROOT / "launchers" / "torchrun.sh"), "--nproc", "2"]
    two = run_align("two_gpu_fsdp", ALIGN_ARMS[a.arm] + device + ["parallel=fsdp"], cfg, rows_file, out, a.steps,
                    a.warmup, fpt, ceiling, env, launcher=launcher, gpus=2)
    runs = {"two_gpu_fsdp": two}
    for i, v in enumerate(a.variant):
        runs[f"two_gpu_fsdp_v{i}: {v}"] = run_align(f"two_gpu_fsdp_v{i}", ALIGN_ARMS[a.arm] + device + ["parallel=fsdp", *v.split()],
                                                   cfg, rows_file, out, a.steps, a.warmup, fpt, ceiling, env,
                                                   launcher=launcher, gpus=2)
    res = {"one_gpu": one.__dict__, "target": 0.92,
           "two_gpu_per_gpu": {k: {**r.__dict__, "per_gpu_ratio": r.real_tokens_per_s / one.real_tokens_per_s}
                               for k, r in runs.items()}}
    (out / "two_gpu.json").write_text(json.dumps(res, indent=1))
    print(f"one GPU ({a.arm}): {one.real_tokens_per_s:,.0f} real tok/s, peak {one.peak_mem_gib:.1f} GiB")
    for k, r in runs.items():
        print(f"{k}: {r.real_tokens_per_s:,.0f} real tok/s per GPU = {r.real_tokens_per_s / one.real_tokens_per_s:.3f}x "
              f"one GPU (target >= 0.92), peak {r.peak_mem_gib:.1f} GiB")


if __name__ == "__main__":
    main()
