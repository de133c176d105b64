"""The GRPO arms of bench/run.py, and the distillation arms with them (the same rollout, one optimizer step
per rollout, the teacher's forwards in the rollout phases as `time/reference_s`): reading an align run,
the engine's own eval throughput at the rollout's shape (bench/generation.py in the same command), and
the table of these arms.

A GRPO arm's row: samples/s (completions per second of the whole optimizer step, one rollout per step),
the generation share of the step, rollout tokens/s (completion tokens per second of generation), update
tokens/s (prompt + completion tokens per second of the step outside its rollout phase: generation,
weight sync, scoring, extra log-prob passes), mean completion length and EOS-stop fraction (a random
model rarely stops: completions run to max_new_tokens in every arm alike), peak allocated GiB, ratios
of samples/s against the baselines, and rollout tokens/s over the engine's eval tokens/s at the same
rows, batch and new tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from bench.common import grpo_measurement

ROOT = Path(__file__).resolve().parents[1]
ROLLOUT_PHASES = ("time/generation_s", "time/sync_s", "time/scoring_s", "time/old_logps_s", "time/reference_s")
"""The rollout phases of align's GRPO step row (align/objectives/grpo_metrics.py `PHASES`); the update is the rest."""


ROLLOUT_KINDS = ("grpo", "distill")
"""The objectives whose arms count completions (samples/s) and go to this table."""


def is_rollout(typed) -> bool:
    return typed is not None and typed.objective.kind in ROLLOUT_KINDS


def read_grpo_run(name: str, run_dir: Path, warmup: int, gpus: int) -> dict[str, Any]:
    """An align GRPO run's measurement from its history.jsonl: wall seconds between step boundaries and
    the objective's per-step phase timers and rollout counts, per GPU when it ran on several."""
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines() if line.strip()]
    if len(rows) <= warmup:
        raise RuntimeError(f"{name}: history has {len(rows)} steps, not more than --warmup {warmup}")
    m = rows[warmup:]
    ends = [rows[warmup - 1]["elapsed_s"], *(r["elapsed_s"] for r in m)]
    step_s = [b - a for a, b in zip(ends[:-1], ends[1:])]
    missing = [k for k in ("rollout/sequences", "rollout/tokens", *ROLLOUT_PHASES) if k not in m[0]]
    if missing:
        raise KeyError(f"{name}: history rows lack {', '.join(missing)}: not a GRPO run with one rollout per step")
    counts = [{"samples": r["rollout/sequences"] / gpus, "completion_tokens": r["rollout/tokens"] / gpus,
               "prompt_tokens": (r["real_tokens"] - r["rollout/tokens"]) / gpus,
               "stopped": r["rollout/stop_frac"] * r["rollout/sequences"] / gpus} for r in m]
    peaks = [r["mem_peak_gib"] for r in rows if r.get("mem_peak_gib") is not None]
    prov = json.loads((run_dir / "provenance.json").read_text())
    model = prov.get("model") or {}
    engine = (((prov.get("objective") or {}).get("loss") or {}).get("engine") or {})
    return grpo_measurement(name, step_s, [r["time/generation_s"] for r in m],
                            [sum(r[k] for k in ROLLOUT_PHASES) for r in m], counts, max(peaks) if peaks else None,
                            gpus=gpus, attn=model.get("attn_implementation_resolved"), dynamo=prov.get("dynamo"),
                            engine={k: engine.get(k) for k in ("mode", "batch_size", "compile") if k in engine},
                            mismatch_kl=m[-1].get("mismatch/kl"), last_loss=rows[-1].get("loss"))


def engine_batch(typed: Any) -> int:
    """The arm's rows per engine call: `objective.generation_batch_size`, or auto resolved as the run
    on this machine will (CUDA when there is one)."""
    import torch

    from align.plan.budget_auto import plan_generation

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return plan_generation(typed, device)[0].objective.generation_batch_size


def engine_shapes(arms: Sequence[Any]) -> dict[str, tuple[int, int, int]]:
    """align GRPO or distillation arm -> (rows per rollout, engine batch size, new tokens) of its rollouts."""
    out = {}
    for x in arms:
        if x.experiment is not None and is_rollout(x.typed):
            o = x.typed.objective
            out[x.name] = (o.prompts_per_rollout * o.group_size, engine_batch(x.typed), o.max_new_tokens)
    return out


def engine_eval(shape: tuple[int, int, int], out: Path, tiny: bool, env: dict,
                timeout: Optional[float], run: Callable) -> dict[str, Any]:
    """The engine's eval throughput at `shape` (bench/generation.py, the arm `backend=auto` resolves to:
    align's engine with CUDA graphs on CUDA, eager on the CPU), bf16 weights, 128-token prompts, and its
    bound (bench/decode_bound.py); its result row or why not."""
    rows, batch, new = shape
    tag = f"engine_{rows}x{new}_b{batch}"
    work = out / tag
    work.mkdir(parents=True, exist_ok=True)
    arm = "align_eager" if tiny else "align_graphs"
    cmd = [sys.executable, str(ROOT / "bench" / "generation.py"), "--arms", arm, "--prompts", str(rows),
           "--batch-size", str(batch), "--new-tokens", str(new), "--warmup", "1", "--calls", "2",
           *(["--tiny"] if tiny else [])]
    rc = run(cmd, out / f"{tag}.log", {**env, "OUT": str(work)}, timeout)
    if rc != 0:
        return {"tag": tag, "error": f"exit {rc} (log: {out / f'{tag}.log'})", "command": cmd}
    r = json.loads((work / "generation.json").read_text())["results"][0]
    keys = ("generated_tokens_per_s", "samples_per_s", "peak_mem_gib", "error", "bound")
    return {"tag": tag, "arm": arm, "command": cmd, **{k: r.get(k) for k in keys}}


def add_engine_ratios(results: list[dict[str, Any]], evals: dict[str, dict[str, Any]]) -> None:
    """`vs_engine_eval`: an align GRPO arm's rollout tokens/s over the engine's eval at its shape."""
    for r in results:
        e = evals.get(r["arm"])
        if e is None:
            continue
        r["engine_eval"] = e
        eng, mine = e.get("generated_tokens_per_s"), r.get("rollout_tokens_per_s")
        r["vs_engine_eval"] = mine / eng if mine is not None and eng else None
        floor = (e.get("bound") or {}).get("tokens_per_s")
        r["bound_share"] = mine / floor if mine is not None and floor and floor == floor else None


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(results: list[dict[str, Any]], baselines: Sequence[str], notes: Callable) -> str:
    head = ["arm", "samples/s", "generation share", "rollout tok/s", "update tok/s", "completion len",
            "stop frac", "peak GiB", *[f"vs {b}" for b in baselines], "vs engine eval", "share of bound", "notes"]
    lines = ["| " + " | ".join(head) + " |", "| --- " + "| ---: " * (len(head) - 2) + "| --- |"]
    for i, r in enumerate(results, 1):
        g = r.get
        ratio = [_fmt(g(f"vs_{b}"), ".2f") + ("x" if g(f"vs_{b}") is not None else "") for b in baselines]
        eng = g("vs_engine_eval")
        cells = [f"({i}) {r['arm']}", _fmt(g("samples_per_s"), ",.1f"), _fmt(g("generation_share"), ".1%"),
                 _fmt(g("rollout_tokens_per_s"), ",.0f"), _fmt(g("update_tokens_per_s"), ",.0f"),
                 _fmt(g("completion_len_mean"), ".1f"), _fmt(g("stop_frac"), ".2f"), _fmt(g("peak_mem_gib"), ".1f"),
                 *ratio, _fmt(eng, ".2f") + ("x" if eng is not None else ""), _fmt(g("bound_share"), ".0%"), notes(r)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "GRPO and distillation arms: samples/s = completions per second of the whole step (one rollout per "
                  "step); ratios between these arms are of samples/s; a distillation arm's rollout phase holds its "
                  "teacher's forwards; vs engine eval = rollout tok/s over bench/generation.py's "
                  "engine (bf16 weights, 128-token prompts) at the same rows, batch and new tokens; share of bound = "
                  "rollout tok/s over that shape's floor (bench/decode_bound.py: weights and live keys/values read "
                  "once per decode step at the copy bandwidth measured in the same process)."]
    return "\n".join(lines)
