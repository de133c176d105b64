"""The DPO and generation suite's summary (bench/gpu_suite.sh runs it last): every arm's result in one
table, each target of the two issues with the arms it reads, its ratio and verdict, and three files
in DEST (the device machine returns at most 8):

    DEST/summary.md      the tables and the targets (also printed)
    DEST/summary.json    every arm's full result, the targets, the setup
    DEST/arms.tar.gz     each arm's own JSON, log, history.jsonl and provenance.json

    python bench/suite_summary.py WORK DEST      # WORK: where the suite's commands wrote ($OUT of each)
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

DPO_PARTS = ("dpo", "dpo_eager")
"""WORK's subfolders holding a bench/run.py command's bench.json, in the suite's order."""
GENERATION_PART = "generation"
NOT_HELD = {"dpo_adapters_off"}
"""Arms that train something else (LoRA adapters), so no full-model target reads them."""


@dataclass(frozen=True)
class Target:
    name: str
    threshold: float
    higher_is_better: bool
    measure: Callable[[dict[str, dict]], tuple[Optional[float], str]]
    """arms by name -> (the ratio, which arms it read)."""


def _ok(r: Optional[dict]) -> bool:
    return r is not None and "error" not in r


def _best(arms: dict[str, dict], key: str, pick: Callable[[dict], bool]) -> Optional[dict]:
    found = [r for r in arms.values() if _ok(r) and r.get(key) is not None and pick(r)]
    return max(found, key=lambda r: r[key]) if found else None


def _align_dpo(r: dict) -> bool:
    return r["arm"].startswith("dpo_") and r["arm"] not in NOT_HELD


def ratio_of(a: Optional[dict], b: Optional[dict], key: str) -> tuple[Optional[float], str]:
    if not (_ok(a) and _ok(b)) or not a.get(key) or not b.get(key):
        return None, f"{a['arm'] if a else '(no align arm)'} / {b['arm'] if b else '(no arm)'}: not both measured"
    return a[key] / b[key], f"{a['arm']} {a[key]:,.1f} / {b['arm']} {b[key]:,.1f}"


def vs_trl(trl_arm: str) -> Callable[[dict[str, dict]], tuple[Optional[float], str]]:
    return lambda arms: ratio_of(_best(arms, "pairs_per_s", _align_dpo), arms.get(trl_arm), "pairs_per_s")


def memory_at_trl_shape(arms: dict[str, dict]) -> tuple[Optional[float], str]:
    return ratio_of(arms.get("dpo_trl_shape"), arms.get("trl_dpo_ref"), "peak_mem_gib")


def live_vs_sft(arms: dict[str, dict]) -> tuple[Optional[float], str]:
    live = _best(arms, "real_tokens_per_s", lambda r: _align_dpo(r) and r.get("reference") == "model")
    return ratio_of(live, arms.get("sft_pairs_best"), "real_tokens_per_s")


def engine_vs_plain(arms: dict[str, dict]) -> tuple[Optional[float], str]:
    engine = _best(arms, "samples_per_s", lambda r: r["arm"].startswith("engine_"))
    return ratio_of(engine, arms.get("plain_dynamic"), "samples_per_s")


TARGETS = (
    Target("DPO: align best >= 5x TRL DPOTrainer with a reference copy (pairs/s)", 5.0, True, vs_trl("trl_dpo_ref")),
    Target("DPO: align best >= 3.5x TRL with precomputed reference log-probs (pairs/s)", 3.5, True,
           vs_trl("trl_dpo_precomputed")),
    Target("DPO: at TRL's batch shape (8 pairs per step) align's peak memory <= TRL's (reference copy)", 1.0, False,
           memory_at_trl_shape),
    Target("DPO: align live-reference real tokens/s >= 0.65x align's best SFT on the same rows", 0.65, True,
           live_vs_sft),
    Target("Generation: align's engine >= 2.5x plain generate in samples/s (64 prompts x 256 new tokens)", 2.5, True,
           engine_vs_plain),
)


def verdicts(arms: dict[str, dict]) -> list[dict[str, Any]]:
    out = []
    for t in TARGETS:
        value, detail = t.measure(arms)
        met = None if value is None else (value >= t.threshold if t.higher_is_better else value <= t.threshold)
        out.append({"target": t.name, "ratio": value, "threshold": t.threshold, "detail": detail,
                    "verdict": "not measured" if met is None else "met" if met else "NOT met"})
    return out


def load(work: Path) -> tuple[dict[str, dict], list[str], dict[str, Any]]:
    """Every arm's result (DPO commands, then generation), the tables as written, the setups."""
    arms: dict[str, dict] = {}
    tables: list[str] = []
    setup: dict[str, Any] = {}
    for part in DPO_PARTS:
        bench = work / part / "bench.json"
        if bench.is_file():
            b = json.loads(bench.read_text())
            arms.update({r["arm"]: r for r in b["results"]})
            setup[part] = {k: b.get(k) for k in ("ceiling_tflops", "pairs", "data", "baselines")}
            tables.append(f"### {part} (bench/run.py)\n\n" + (work / part / "bench.md").read_text())
    gen = work / GENERATION_PART / "generation.json"
    if gen.is_file():
        g = json.loads(gen.read_text())
        arms.update({r["arm"]: r for r in g["results"]})
        setup[GENERATION_PART] = g["setup"]
        md = (work / GENERATION_PART / "generation.md").read_text()
        tables.append("### generation (bench/generation.py)\n\n" + md)
    return arms, tables, setup


def target_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| target | ratio | verdict | arms read |", "| --- | ---: | --- | --- |"]
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        lines.append(f"| {r['target']} | {ratio} | {r['verdict']} | {r['detail']} |")
    return "\n".join(lines)


def pack(work: Path, dest: Path) -> None:
    """Each arm's JSON, log, history and provenance (not the data files, caches or checkpoints)."""
    keep = ("*.json", "*.log", "*.md", "runs/*/history.jsonl", "runs/*/provenance.json", "runs/*/measurement.json")
    with tarfile.open(dest / "arms.tar.gz", "w:gz") as tar:
        for part in (*DPO_PARTS, GENERATION_PART):
            for pattern in keep:
                for f in sorted((work / part).glob(pattern)):
                    tar.add(f, arcname=str(f.relative_to(work)))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("dest", type=Path)
    a = ap.parse_args(argv)
    arms, tables, setup = load(a.work)
    if not arms:
        print(f"bench/suite_summary.py: no bench.json or generation.json under {a.work}", file=sys.stderr)
        return 2
    rows = verdicts(arms)
    md = "\n\n".join(["## Targets", target_table(rows), *tables]) + "\n"
    a.dest.mkdir(parents=True, exist_ok=True)
    (a.dest / "summary.md").write_text(md)
    (a.dest / "summary.json").write_text(json.dumps({"targets": rows, "setup": setup, "arms": arms}, indent=1))
    pack(a.work, a.dest)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
