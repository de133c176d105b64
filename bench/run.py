"""One command, every arm, one GPU: HF Trainer (padded, padding-free, 2048-token ceiling) against
align (shuffle, bucket, best), same model, same data distribution, same number of optimizer steps.

    python bench/run.py [--steps 40] [--align-steps 60] [--arms ...] [--tiny]   # results under $OUT (default outputs/bench)

Each arm runs in its own process (clean allocator, honest peak memory), one after another. The table
is printed and written to $OUT/bench.json and $OUT/bench.md.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import MODEL, TINY, bimodal_lengths, matmul_ceiling_tflops, read_rows, summarise, token_rows  # noqa: E402
from bench.common import parse_defines, profile_kernels, useful_flops_per_token, write_rows  # noqa: E402

HF_ARMS = ["hf_padded", "hf_flatten", "hf_ceiling"]
# align's arms: overrides on top of the common ones in align_overrides().
BUDGET = ["sampler=budget", "sampler.bucket_size=100000", "sampler.mask_padding=false"]
ALIGN_ARMS: dict[str, list[str]] = {
    "align_shuffle": ["sampler=shuffle", "sampler.micro_batch_size=8"],
    "align_bucket": ["sampler=bucket", "sampler.micro_batch_size=8", "sampler.bucket_size=100000"],
    # the best found (2026-11-30, session 4): 24k-token budget, pad to 8, no padding mask, flash-first
    # SDPA (default), decoder blocks compiled with one dynamic graph for every ragged shape
    "align_best": [*BUDGET, "sampler.max_tokens=24576", "sampler.pad_to_multiple_of=8", "trainer.compile=true",
                   "trainer.compile_dynamic=true"],
    # the best arm of sessions 2-3: the same, eager; the ablations below are relative to it
    "align_eager": [*BUDGET, "sampler.max_tokens=24576", "sampler.pad_to_multiple_of=8"],
    # ablations of the best arm, one lever at a time (docs/performance.md)
    "abl_masked": [*BUDGET, "sampler.max_tokens=24576", "sampler.pad_to_multiple_of=8", "sampler.mask_padding=true"],
    "abl_cudnn": [*BUDGET, "sampler.max_tokens=24576", "sampler.pad_to_multiple_of=8", "attention.sdpa_kernels=[]"],
    "abl_budget16k": [*BUDGET, "sampler.max_tokens=16384", "sampler.pad_to_multiple_of=8"],
    "abl_pad64": [*BUDGET, "sampler.max_tokens=24576", "sampler.pad_to_multiple_of=64"],
}


def align_overrides(cfg: dict, rows_file: Path, out: Path, steps: int) -> list[str]:
    model = [f"+model.overrides.{k}={'null' if v is None else v}" for k, v in cfg.items()]
    return ["model=mistral", *model, "data=tokens", f"data.path={rows_file}", "data.max_seq_len=4096",
            f"data.cache_dir={out / 'cache'}", "logger=none", "trainer.export=false", f"trainer.max_steps={steps}",
            "optimizer.lr=1e-4", "optimizer.warmup_ratio=0", "optimizer.max_grad_norm=1.0", "trainer.log_every=10",
            "allow_dirty=true"]


def run_align(arm: str, extra: list[str], cfg: dict, rows_file: Path, out: Path, steps: int, warmup: int,
              flops_per_token: float, ceiling: float, env: dict, launcher: list[str] | None = None, gpus: int = 1):
    """An align arm through its real entry point (`launcher`: e.g. launchers/torchrun.sh for several
    GPUs). Rates are per GPU: history rows hold tokens summed over ranks."""
    run_dir = out / "runs" / arm
    entry = launcher or [sys.executable, "-m", "align.train"]
    cmd = [*entry, *align_overrides(cfg, rows_file, out, steps), *extra, f"hydra.run.dir={run_dir}"]
    log = out / f"{arm}.log"
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        raise RuntimeError(f"{arm} exited {rc}: {(log.read_text().strip().splitlines() or [''])[-1][:300]}")
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    m = rows[warmup:]
    seconds = m[-1]["elapsed_s"] - rows[warmup - 1]["elapsed_s"]
    peak = max((r.get("mem_peak_gib") or float("nan")) for r in rows)
    prov = json.loads((run_dir / "provenance.json").read_text())
    dyn = prov.get("dynamo") or {}
    notes = (f"attn={prov['model'].get('attn_implementation_resolved')}; recompiles={dyn.get('recompiles')}, "
             f"graph_breaks={dyn.get('graph_breaks')}" + (f", RECOMPILE LIMIT HIT {dyn['recompile_limit_hits']}x: frames ran eager"
                                                           if dyn.get("recompile_limit_hits") else ""))
    return summarise(arm, seconds * gpus, sum(r["real_tokens"] for r in m), sum(r["tokens"] for r in m), len(m), peak,
                     flops_per_token, ceiling, notes + (f"; per GPU of {gpus}" if gpus > 1 else ""))


def table(results: list[dict], ceiling: float) -> str:
    by = {r["arm"]: r for r in results}
    base1, base3 = by.get("hf_padded"), by.get("hf_ceiling")
    lines = [f"bf16 matmul ceiling measured in this run: {ceiling:.0f} TFLOP/s", "",
             "| arm | real tok/s | tok/s | padding waste | useful MFU | peak mem GiB | vs arm 1 | vs arm 3 | notes |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for i, r in enumerate(results, 1):
        v1 = f"{r['real_tokens_per_s'] / base1['real_tokens_per_s']:.2f}x" if base1 else "-"
        v3 = f"{r['real_tokens_per_s'] / base3['real_tokens_per_s']:.2f}x" if base3 else "-"
        lines.append(f"| ({i}) {r['arm']} | {r['real_tokens_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | "
                     f"{r['padding_waste']:.1%} | {r['mfu']:.1%} | {r['peak_mem_gib']:.1f} | {v1} | {v3} | {r['notes']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps of the HF arms (8 rows each)")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--align-steps", type=int, default=60)
    ap.add_argument("--align-warmup", type=int, default=10)
    ap.add_argument("--rows", type=int, default=4000, help="bimodal rows in the shared data file")
    ap.add_argument("--arms", default=",".join(HF_ARMS + list(ALIGN_ARMS)))
    ap.add_argument("--tiny", action="store_true", help="CPU-sized model: checks the harness, measures nothing")
    ap.add_argument("--define", action="append", default=[], metavar="NAME='OVERRIDES'",
                    help="an extra align arm: NAME='ov1 ov2 ...' (then name it in --arms)")
    ap.add_argument("--profile", default="", help="comma-separated align arms whose kernel table to print after the arms")
    a = ap.parse_args()
    ALIGN_ARMS.update(parse_defines(a.define))

    out = Path(os.environ.get("OUT", "outputs/bench")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg = TINY if a.tiny else MODEL
    rows_file = out / "bimodal_rows.jsonl"
    lengths = bimodal_lengths(a.rows)
    write_rows(rows_file, token_rows(lengths, cfg["vocab_size"]))
    mean, m2 = float(lengths.mean()), float((lengths.astype(float) ** 2).mean())
    print(f"data: {a.rows} rows, mean {mean:.0f} tokens, E[w^2]/E[w]^2 {m2 / mean**2:.2f}, max {lengths.max()}", flush=True)
    ceiling = matmul_ceiling_tflops()
    fpt = useful_flops_per_token(cfg, lengths)
    fpt_ceiling = useful_flops_per_token(cfg, np.full(8, 2048))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    results = []
    for arm in a.arms.split(","):
        t0 = time.time()
        if arm in HF_ARMS:
            res_file = out / f"{arm}.json"
            cmd = [sys.executable, str(ROOT / "bench" / "hf_arm.py"), "--arm", arm, "--steps", str(a.steps),
                   "--warmup", str(a.warmup), "--rows-file", str(rows_file), "--out", str(res_file)] + (["--tiny"] if a.tiny else [])
            with (out / f"{arm}.log").open("w") as f:
                rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
            if rc != 0:
                print(f"{arm}: exited {rc}, see {out / f'{arm}.log'}", flush=True)
                continue
            r = json.loads(res_file.read_text())
        else:
            try:
                r = run_align(arm, ALIGN_ARMS[arm], cfg, rows_file, out, a.align_steps, a.align_warmup, fpt, ceiling, env).__dict__
            except RuntimeError as e:
                print(e, flush=True)
                continue
        results.append(r)
        print(f"{arm}: {r['real_tokens_per_s']:,.0f} real tok/s, waste {r['padding_waste']:.1%}, "
              f"peak {r['peak_mem_gib']:.1f} GiB ({time.time() - t0:.0f}s)", flush=True)

    md = table(results, ceiling)
    print(md)
    (out / "bench.md").write_text(md + "\n")
    for arm in filter(None, a.profile.split(",")):
        profile_kernels([*align_overrides(cfg, rows_file, out, a.align_steps), *ALIGN_ARMS[arm]], out, arm, env)
    (out / "bench.json").write_text(json.dumps({"ceiling_tflops": ceiling, "model": cfg, "rows": a.rows,
                                                "useful_flops_per_token": fpt, "useful_flops_per_token_2048": fpt_ceiling,
                                                "results": results}, indent=1))


if __name__ == "__main__":
    main()
