"""One benchmark harness: align arms are experiment configs (conf/experiment/bench/<name>.yaml, run as
`python -m align.train experiment=bench/<name>`), reference arms are code (bench/hf_arm.py). One
command runs the arms it is given, one after another, each in its own process (clean allocator, honest
peak memory), on token rows it writes once, and prints and writes one table.

    python bench/run.py hf_padded hf_ceiling dense_best dense_eager     # results under $OUT (default outputs/bench)
    python bench/run.py experiment=bench/moe_fast hf_moe_fwd_bwd         # experiment=... names work too
    python bench/run.py --list                                          # every arm
    python bench/run.py --dry-run dense_best hf_padded                  # validate and print the commands only
    python bench/run.py --tiny dense_eager hf_padded --steps 4 --warmup 2 --rows 200   # CPU shake-out

An arm whose experiment selects parallel=fsdp or parallel=ep is launched on --nproc processes through
launchers/torchrun.sh; its rates are per GPU. Each arm's result is $OUT/<arm>.json; the table is
$OUT/bench.md and everything together $OUT/bench.json. Measured numbers go to docs/performance.md with
their date and machine, never into this code.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    add_ratios,
    bimodal_lengths,
    compose_typed,
    experiment_names,
    hf_config,
    matmul_ceiling_tflops,
    measurement,
    model_flops,
    summarise,
    tiny_overrides,
    token_rows,
    useful_flops_per_token,
    write_rows,
)
from bench.hf_arm import REFERENCE_ARMS, reference_config  # noqa: E402

LAUNCHER = ROOT / "launchers" / "torchrun.sh"


@dataclass
class Arm:
    """One arm of a command, resolved: what runs, where it writes, what it needs of the shared rows."""

    name: str
    experiment: Optional[str]
    """`bench/<name>` for an align arm; None for a reference arm."""
    overrides: list[str] = field(default_factory=list)
    """An align arm's overrides: the experiment and what this command adds to it."""
    cmd: list[str] = field(default_factory=list)
    run_dir: Path = Path()
    gpus: int = 1
    vocab: int = 0
    """Rows drawn for this command must stay below every arm's vocabulary."""
    typed: Any = None


def die(message: str) -> NoReturn:
    from align.run.cli import die as align_die

    align_die(message)


def arm_name(token: str) -> str:
    """`dense_best`, `bench/dense_best` and `experiment=bench/dense_best` name the same arm."""
    return token.removeprefix("experiment=").removeprefix("bench/")


def resolve(token: str) -> Arm:
    name = arm_name(token)
    if name in REFERENCE_ARMS:
        return Arm(name, None)
    if name in experiment_names():
        return Arm(name, f"bench/{name}")
    die(f"{token}: no such arm; reference arms: {', '.join(sorted(REFERENCE_ARMS))}; experiments "
        f"(conf/experiment/bench/): {', '.join(experiment_names())}")


def align_overrides(arm: Arm, a: argparse.Namespace, out: Path, rows_file: Path) -> list[str]:
    """The experiment plus what belongs to this command, not to the experiment: the rows it wrote,
    its cache dir, its step count, and with --tiny the CPU-sized preset."""
    experiment = [f"experiment={arm.experiment}"]
    tiny = tiny_overrides(_typed_or_die(arm, experiment)) if a.tiny else []
    return [*experiment, f"data.path={rows_file}", f"data.cache_dir={out / 'cache'}", "allow_dirty=true",
            *([f"trainer.max_steps={a.steps}"] if a.steps is not None else []), *tiny]


def _typed_or_die(arm: Arm, overrides: list[str]):
    from align.run.cli import describe

    try:
        return compose_typed(overrides)
    except Exception as exc:  # a composition or value error of this arm: one line, before any run
        die(f"{arm.name} (experiment={arm.experiment}): {describe(exc)}")


def plan_align(arm: Arm, a: argparse.Namespace, out: Path, rows_file: Path) -> Arm:
    arm.overrides = overrides = align_overrides(arm, a, out, rows_file)
    arm.typed = _typed_or_die(arm, overrides)
    steps = arm.typed.trainer.max_steps
    if not 1 <= a.warmup < steps:
        die(f"{arm.name}: --warmup {a.warmup} must be >= 1 and below trainer.max_steps={steps} (--steps sets it)")
    arm.run_dir = out / "runs" / arm.name
    if arm.typed.parallel.kind.value == "single":
        entry = [sys.executable, "-m", "align.train"]
    else:
        entry, arm.gpus = ["bash", str(LAUNCHER), "--nproc", str(a.nproc)], a.nproc
    arm.cmd = [*entry, *overrides, f"hydra.run.dir={arm.run_dir}"]
    arm.vocab = hf_config(arm.typed).vocab_size
    return arm


def plan_reference(arm: Arm, a: argparse.Namespace, out: Path, rows_file: Path) -> Arm:
    if not 1 <= a.hf_warmup < a.hf_steps:
        die(f"{arm.name}: --hf-warmup {a.hf_warmup} must be >= 1 and below --hf-steps {a.hf_steps}")
    arm.typed = reference_config(arm.name, a.tiny)
    arm.run_dir = out / "runs" / arm.name
    arm.cmd = [sys.executable, str(ROOT / "bench" / "hf_arm.py"), "--arm", arm.name, "--steps", str(a.hf_steps),
               "--warmup", str(a.hf_warmup), "--rows-file", str(rows_file),
               "--out", str(arm.run_dir / "measurement.json"), *(["--tiny"] if a.tiny else [])]
    arm.vocab = hf_config(arm.typed).vocab_size
    return arm


def plan(tokens: Sequence[str], a: argparse.Namespace, out: Path, rows_file: Path) -> list[Arm]:
    """Resolve and validate every arm of the command (exit 2 on the first bad one), running nothing."""
    arms = [resolve(t) for t in tokens]
    names = [x.name for x in arms]
    if len(set(names)) != len(names):
        die(f"an arm is named twice: {' '.join(names)}")
    for n in a.baseline:
        if n not in names:
            die(f"--baseline {n}: not an arm of this command ({' '.join(names)})")
    for n in a.profile:
        if n not in names or n in REFERENCE_ARMS:
            die(f"--profile {n}: not an align arm of this command ({' '.join(names)})")
    return [plan_reference(x, a, out, rows_file) if x.experiment is None else plan_align(x, a, out, rows_file)
            for x in arms]


def profile_command(arm: Arm, out: Path) -> list[str]:
    """The kernel table (align.tools.probe probe=kernels) of an align arm's exact configuration."""
    overrides = [o for o in arm.overrides if not o.startswith("trainer.max_steps=")]  # the probe counts its own
    return [sys.executable, "-m", "align.tools.probe", "probe=kernels", "probe.kernels.warmup=6",
            "probe.kernels.timed_steps=4", "probe.kernels.steps=3", *overrides,
            f"hydra.run.dir={out / 'runs' / ('kernels_' + arm.name)}"]


# -------------------------------------------------------------------------------------- measuring


def read_align_run(arm: Arm, warmup: int, useful_per_token: float) -> dict[str, Any]:
    """An align run's measurement from its history.jsonl (wall clock between step boundaries, tokens
    summed over ranks) and provenance.json; per GPU when it ran on several."""
    rows = [json.loads(line) for line in (arm.run_dir / "history.jsonl").read_text().splitlines() if line.strip()]
    if len(rows) <= warmup:
        raise RuntimeError(f"{arm.name}: history has {len(rows)} steps, not more than --warmup {warmup}")
    m = rows[warmup:]
    seconds = m[-1]["elapsed_s"] - rows[warmup - 1]["elapsed_s"]
    real = sum(r["real_tokens"] for r in m) / arm.gpus
    peaks = [r["mem_peak_gib"] for r in rows if r.get("mem_peak_gib") is not None]
    prov = json.loads((arm.run_dir / "provenance.json").read_text())
    model = prov.get("model") or {}
    extra = model.get("extra") or {}
    counted = [r.get("model_flops") for r in m]
    return measurement(
        arm.name, seconds, len(m), real, sum(r["tokens"] for r in m) / arm.gpus,
        sum(counted) if None not in counted else None, real * useful_per_token, max(peaks) if peaks else None,
        gpus=arm.gpus, step_ms=[round(r["step_time_s"] * 1000) for r in m], last_loss=rows[-1].get("loss"),
        alloc_retries=rows[-1].get("mem_alloc_retries"), attn=model.get("attn_implementation_resolved"),
        experts=model.get("experts_implementation_resolved"), optimizer=extra.get("optimizer_impl"),
        optimizer_step=(extra.get("optimizer_step") or {}).get("kind"), dynamo=prov.get("dynamo"))


def run_arm(arm: Arm, a: argparse.Namespace, out: Path, env: dict, lengths) -> dict[str, Any]:
    shutil.rmtree(arm.run_dir, ignore_errors=True)  # this OUT's previous result of the arm, not a run to resume
    arm.run_dir.mkdir(parents=True)
    log = out / f"{arm.name}.log"
    with log.open("w") as f:
        rc = subprocess.run(arm.cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        tail = (log.read_text().strip().splitlines() or [""])[-1][:300]
        return {"arm": arm.name, "error": f"exit {rc}: {tail} (log: {log})"}
    if arm.experiment is None:
        return json.loads((arm.run_dir / "measurement.json").read_text())
    return read_align_run(arm, a.warmup, useful_flops_per_token(model_flops(arm.typed), lengths))


def notes(r: dict[str, Any]) -> str:
    if "error" in r:
        return r["error"]
    parts = [f"{k}={r[k]}" for k in ("attn", "experts", "optimizer_step") if r.get(k)]
    dyn = r.get("dynamo") or {}
    if dyn:
        parts.append(f"recompiles={dyn.get('recompiles')}, graph_breaks={dyn.get('graph_breaks')}")
        if dyn.get("recompile_limit_hits"):
            parts.append(f"RECOMPILE LIMIT HIT {dyn['recompile_limit_hits']}x: frames ran eager")
    if r.get("gpus", 1) > 1:
        parts.append(f"per GPU of {r['gpus']}")
    return "; ".join(parts)


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def table(results: list[dict[str, Any]], ceiling: Optional[float], baselines: Sequence[str]) -> str:
    head = ["arm", "real tok/s", "tok/s", "padding waste", "tokens/step", "useful MFU", "counted MFU", "peak GiB",
            *[f"vs {b}" for b in baselines], "notes"]
    lines = [f"bf16 matmul ceiling measured in this command: {_fmt(ceiling, '.0f')} TFLOP/s", "",
             "| " + " | ".join(head) + " |", "| --- " + "| ---: " * (len(head) - 2) + "| --- |"]
    for i, r in enumerate(results, 1):
        g = r.get
        cells = [f"({i}) {r['arm']}", _fmt(g("real_tokens_per_s"), ",.0f"), _fmt(g("tokens_per_s"), ",.0f"),
                 _fmt(g("padding_waste"), ".1%"), _fmt(g("tokens_per_step"), ",.0f"), _fmt(g("useful_mfu"), ".1%"),
                 _fmt(g("counted_mfu"), ".1%"), _fmt(g("peak_mem_gib"), ".1f"),
                 *[_fmt(g(f"vs_{b}"), ".2f") + ("x" if g(f"vs_{b}") is not None else "") for b in baselines], notes(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _clean(obj):
    """JSON without NaN (a CPU command has no ceiling)."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


# ------------------------------------------------------------------------------------------- main


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("arms", nargs="*", help="arm names: reference arms and conf/experiment/bench/ names (--list)")
    ap.add_argument("--list", action="store_true", help="print every arm and exit")
    ap.add_argument("--dry-run", action="store_true", help="validate every arm and print its command; run nothing")
    ap.add_argument("--steps", type=int, default=None,
                    help="trainer.max_steps of every align arm (default: each experiment's own)")
    ap.add_argument("--warmup", type=int, default=10, help="align steps not measured (compiled arms compile in them)")
    ap.add_argument("--hf-steps", type=int, default=30, help="steps of the reference arms, the warm-up included")
    ap.add_argument("--hf-warmup", type=int, default=8, help="reference steps not measured")
    ap.add_argument("--rows", type=int, default=4000, help="bimodal rows in the shared data file")
    ap.add_argument("--nproc", type=int, default=2, help="processes (GPUs) of an arm with parallel=fsdp or ep")
    ap.add_argument("--baseline", default=None,
                    help="comma-separated arms of this command to give ratios against (default: its reference arms)")
    ap.add_argument("--profile", default="",
                    help="comma-separated align arms whose kernel table to print after the arms")
    ap.add_argument("--tiny", action="store_true", help="every arm's tiny preset on the CPU: checks the harness, "
                                                        "measures nothing")
    a = ap.parse_args(argv)
    a.profile = [x for x in (arm_name(p) for p in a.profile.split(",")) if x]
    a.baseline = [x for x in (arm_name(p) for p in a.baseline.split(",")) if x] if a.baseline is not None else \
        [arm_name(t) for t in a.arms if arm_name(t) in REFERENCE_ARMS]
    return a


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    if a.list:
        print("reference arms (bench/hf_arm.py):", " ".join(sorted(REFERENCE_ARMS)))
        print("align arms (conf/experiment/bench/):", " ".join(experiment_names()))
        return 0
    if not a.arms:
        die("name at least one arm (python bench/run.py --list)")
    out = Path(os.environ.get("OUT", "outputs/bench")).resolve()
    rows_file = out / "rows.jsonl"
    arms = plan(a.arms, a, out, rows_file)
    if a.dry_run:
        for arm in arms:
            print(f"{arm.name}: {shlex.join(arm.cmd)}")
        for name in a.profile:
            print(f"kernels of {name}: {shlex.join(profile_command(next(x for x in arms if x.name == name), out))}")
        return 0
    return execute(arms, a, out, rows_file)


def execute(arms: list[Arm], a: argparse.Namespace, out: Path, rows_file: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    lengths = bimodal_lengths(a.rows)
    vocab = min(x.vocab for x in arms)
    write_rows(rows_file, token_rows(lengths, vocab))
    mean, m2 = float(lengths.mean()), float((lengths.astype(float) ** 2).mean())
    print(f"data: {a.rows} rows below id {vocab}, mean {mean:.0f} tokens, E[w^2]/E[w]^2 {m2 / mean**2:.2f}, "
          f"max {lengths.max()}", flush=True)
    ceiling = matmul_ceiling_tflops()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "PYTHON": sys.executable}  # launchers/torchrun.sh runs $PYTHON
    results = []
    for arm in arms:
        t0 = time.time()
        try:
            m = run_arm(arm, a, out, env, lengths)
        except (RuntimeError, OSError, KeyError, ValueError) as e:  # one arm's unreadable output, not the command's
            m = {"arm": arm.name, "error": f"{type(e).__name__}: {e}"}
        r = m if "error" in m else summarise(m, ceiling)
        r.update(command=shlex.join(arm.cmd), wall_s=round(time.time() - t0, 1))
        results.append(r)
        (out / f"{arm.name}.json").write_text(json.dumps(_clean(r), indent=1))
        print(f"{arm.name}: " + (r["error"] if "error" in r else
                                 f"{r['real_tokens_per_s']:,.0f} real tok/s, waste {r['padding_waste']:.1%}, "
                                 f"peak {_fmt(r['peak_mem_gib'], '.1f')} GiB ({r['wall_s']:.0f}s)"), flush=True)
    add_ratios(results, a.baseline)
    md = table(results, ceiling, a.baseline)
    print(md)
    (out / "bench.md").write_text(md + "\n")
    (out / "bench.json").write_text(json.dumps(_clean({"ceiling_tflops": ceiling, "rows": a.rows, "vocab_bound": vocab,
                                                       "baselines": a.baseline, "results": results}), indent=1))
    for name in a.profile:
        arm = next(x for x in arms if x.name == name)
        run_dir = out / "runs" / f"kernels_{name}"
        cmd = profile_command(arm, out)
        with (out / f"kernels_{name}.log").open("w") as f:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
        report = run_dir / "kernels.md"
        print(f"---- kernels of {name} (exit {rc}) ----")
        print(report.read_text() if report.exists() else (out / f"kernels_{name}.log").read_text()[-3000:], flush=True)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
