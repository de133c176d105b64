"""GPU evidence for parallel=fsdp / parallel=ep and for stop + resume, in one command.

    python scripts/dist_evidence.py                 # on the GPU machine (2 GPUs when there are, else 1)
    python scripts/dist_evidence.py --cpu           # shake-out on CPU: 2 gloo processes, tiny model

Runs (all through the real entry points: `python -m align.train`, launchers/torchrun.sh and
`python -m align.tools.supervise`), on an OLMoE-shaped model (64 experts, top-8; smaller width and depth):
  1. reference: one process, parallel=single, window = 2 micro-batches
  2. parallel=fsdp on N ranks, window = 2/N micro-batches per rank (same global window)
  3. parallel=ep on N ranks (N >= 2), experts sharded over the ranks, all-to-all dispatch
  4. uninterrupted fsdp run of STOP_STEPS steps
  5. the same run under the supervisor; SIGTERM to the LAST rank's PID at step 4 -> coordinated stop,
     stop checkpoint, relaunch, resume, finish; compared step by step with 4.
Parity runs are fp32 (trainer.precision=fp32, parallel.param_dtype=float32) so the comparison is of
the parallelism, not of bf16 rounding. Writes $OUT/dist_evidence.json (default ./outputs/gpu) and prints
a table. Expected: a few minutes on one H200 node.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS, STOP_STEPS, STOP_AT = 5, 12, 4

OLMOE_SHAPE = [  # the OLMoE-1B-7B architecture (64 experts, top-8, qk-norm) at 1/2 width, 1/4 depth
    "model=olmoe", "+model.overrides.hidden_size=1024", "+model.overrides.intermediate_size=512",
    "+model.overrides.num_hidden_layers=4", "+model.overrides.num_attention_heads=16",
    "+model.overrides.num_key_value_heads=16", "+model.overrides.num_experts=64",
    "+model.overrides.num_experts_per_tok=8",
]
COMMON = ["logger=none", "trainer.export=false", "allow_dirty=true", "trainer.log_every=1",
          "data.max_records=512", "data.max_seq_len=512", "data.truncation=truncate", "sampler=shuffle",
          "sampler.micro_batch_size=4",
          "optimizer.warmup_ratio=0", "optimizer.lr=3e-4",
          "trainer.compile=false", "optimizer.compile=false"]  # parity of the layouts: the same eager code in each
FP32 = ["trainer.precision=fp32"]
SHARDED_FP32 = ["parallel.param_dtype=float32"]  # the sharded layouts' own key (parallel=single refuses it)


def parity_arms(base: list[str], n: int) -> dict[str, list[str]]:
    """The parity runs' overrides (without their run dirs): one process at grad_accum 2, and each layout
    on n ranks at the same global batch."""
    par = [*base, *FP32, f"trainer.max_steps={STEPS}"]
    accum = max(2 // n, 1)
    arms = {"single": [*par, "parallel=single", "trainer.grad_accum=2"],
            "fsdp": [*par, *SHARDED_FP32, "parallel=fsdp", f"trainer.grad_accum={accum}"]}
    if n >= 2:
        arms["ep"] = [*par, *SHARDED_FP32, "parallel=ep", f"trainer.grad_accum={accum}"]
    return arms


def history(run_dir: Path) -> list[dict]:
    p = run_dir / "history.jsonl"
    if not p.is_file():
        return []
    rows = []
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # the last line of a history still being written
            break
    return rows


def sh(cmd: list[str], env: dict, log: Path, timeout: float = 900) -> int:
    with open(log, "w") as f:
        return subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode


def train(overrides: list[str], env: dict, log: Path) -> int:
    return sh([sys.executable, "-m", "align.train", *overrides], env, log)


def torchrun(n: int, overrides: list[str], env: dict, log: Path) -> int:
    return sh([str(REPO / "launchers" / "torchrun.sh"), *overrides], {**env, "NPROC": str(n)}, log)


def worker_pid(root_pid: int, rank: int) -> int | None:
    """The PID of torchrun's worker of rank `rank` below `root_pid`: the process tree from /proc, and
    each descendant's own environment (RANK=r set by torchrun). A PID, never a name pattern."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    todo = list(children.get(root_pid, []))
    while todo:
        pid = todo.pop()
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and any(e.startswith(b"TORCHELASTIC_RUN_ID=") for e in env):
            return pid
        todo += children.get(pid, [])
    return None


def compare(ref: list[dict], got: list[dict]) -> dict:
    pairs = [(a, b) for a in ref for b in got if a["step"] == b["step"]]
    dl = [abs(a["loss"] - b["loss"]) for a, b in pairs]
    dg = [abs(a["grad_norm"] - b["grad_norm"]) / max(abs(a["grad_norm"]), 1e-12) for a, b in pairs]
    return {"steps": len(pairs), "max_abs_loss_diff": max(dl) if dl else None,
            "max_rel_grad_norm_diff": max(dg) if dg else None,
            "bit_identical_losses": bool(pairs) and all(a["loss"] == b["loss"] for a, b in pairs)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="2 gloo CPU processes, tiny model (shake-out)")
    ap.add_argument("--ngpu", type=int, default=None)
    args = ap.parse_args()
    out = Path(os.environ.get("OUT", "outputs/gpu")).resolve() / "dist_evidence"
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
           "PYTHONUNBUFFERED": "1"}
    if args.cpu:
        n, model, dev = 2, ["model=olmoe"], ["trainer.device=cpu"]
        common = [c for c in COMMON if not c.startswith(("data.max_records", "data.max_seq_len"))] + [
            "data.max_records=96", "data.max_seq_len=64"]
    else:
        import torch

        n = args.ngpu or min(torch.cuda.device_count(), 2)
        model, dev, common = OLMOE_SHAPE, ["trainer.device=cuda"], COMMON
    base = [*model, *dev, *common]
    report: dict = {"ranks": n, "device": "cpu" if args.cpu else "cuda", "model": model, "runs": {}}
    t0 = time.time()

    def run_dir(name: str) -> Path:
        return out / name

    for name in ("single", "fsdp", "ep", "uninterrupted", "supervised"):  # this OUT's previous results: a
        shutil.rmtree(run_dir(name), ignore_errors=True)  # finished run dir is never written again (align.run.run_dir)

    # 1-3: parity, fp32
    codes = {}
    for k, overrides in parity_arms(base, n).items():
        launch = train if k == "single" else functools.partial(torchrun, n)
        codes[k] = launch([*overrides, f"hydra.run.dir={run_dir(k)}"], env, out / f"{k}.log")
    ref = history(run_dir("single"))
    for k, c in codes.items():
        rows = history(run_dir(k))
        report["runs"][k] = {"exit": c, "losses": [r["loss"] for r in rows],
                             "step_time_s": [round(r["step_time_s"], 3) for r in rows]}
        if k != "single":
            report["runs"][k]["vs_single"] = compare(ref, rows)

    # 4-5: SIGTERM to the last rank + supervisor relaunch + resume vs uninterrupted (default precision)
    stop = [*base, "parallel=fsdp", f"trainer.max_steps={STOP_STEPS}", f"trainer.grad_accum={max(2 // n, 1)}"]
    code = torchrun(n, [*stop, f"hydra.run.dir={run_dir('uninterrupted')}"], env, out / "uninterrupted.log")
    report["runs"]["uninterrupted"] = {"exit": code, "losses": [r["loss"] for r in history(run_dir("uninterrupted"))]}
    sup_dir = run_dir("supervised")
    sup_cmd = [sys.executable, "-m", "align.tools.supervise", "--backoff", "2", "--",
               str(REPO / "launchers" / "torchrun.sh"), *stop, f"hydra.run.dir={sup_dir}"]
    with open(out / "supervised.log", "w") as f:
        sup = subprocess.Popen(sup_cmd, cwd=REPO, env={**env, "NPROC": str(n)}, stdout=f, stderr=subprocess.STDOUT)
        signalled = None
        deadline = time.time() + 900
        while sup.poll() is None and time.time() < deadline:
            if signalled is None and len(history(sup_dir)) >= STOP_AT:
                pid = worker_pid(sup.pid, n - 1)
                if pid:
                    os.kill(pid, signal.SIGTERM)
                    signalled = {"rank": n - 1, "pid": pid, "after_step": len(history(sup_dir))}
            time.sleep(0.2)
        if sup.poll() is None:
            sup.kill()
    sup_log = sup_dir / "supervisor.jsonl"
    rows = [json.loads(x) for x in sup_log.read_text().splitlines()] if sup_log.is_file() else []
    ckpts = sup_dir / "checkpoints"
    stops = sorted(p.name for p in ckpts.glob("step_*")) if ckpts.is_dir() else []
    report["runs"]["supervised"] = {
        "exit": sup.returncode, "signal": signalled, "checkpoints": stops,
        "attempts": [{k: r.get(k) for k in ("attempt", "code", "newest_checkpoint", "progressed")}
                     for r in rows if r["event"] == "exit"],
        "history_steps": [r["step"] for r in history(sup_dir)],
        "losses": [r["loss"] for r in history(sup_dir)],
        "vs_uninterrupted": compare(history(run_dir("uninterrupted")), history(sup_dir)),
    }
    report["wall_s"] = round(time.time() - t0, 1)
    (out / "dist_evidence.json").write_text(json.dumps(report, indent=2))

    print(f"\n{'run':<14}{'exit':>5}  {'comparison':<52} first losses")
    for k, r in report["runs"].items():
        cmp = r.get("vs_single") or r.get("vs_uninterrupted") or {}
        d = cmp.get("max_abs_loss_diff")
        c = (f"max|dloss| {d:.2e} over {cmp['steps']} steps, bit-identical {cmp['bit_identical_losses']}"
             if d is not None else "")
        print(f"{k:<14}{r['exit']!s:>5}  {c:<52} {[round(x, 4) for x in r.get('losses', [])][:5]}")
    s = report["runs"]["supervised"]
    print(f"supervised: signal {s['signal']}, attempts {s['attempts']}, checkpoints {s['checkpoints']}")
    print(f"wrote {out / 'dist_evidence.json'} in {report['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
