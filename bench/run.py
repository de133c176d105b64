"""One benchmark harness: align arms are experiment configs (conf/experiment/bench/<name>.yaml, run as
`python -m align.train experiment=bench/<name>`), reference arms are code (bench/hf_arm.py: HF Trainer
and transformers' model; bench/trl_arm.py: TRL's DPOTrainer; bench/trl_grpo.py: TRL's GRPOTrainer;
bench/trl_objectives.py: TRL's KTOTrainer, RewardTrainer and GKDTrainer; bench/handwritten_arm.py: a
hand-written loop on uniform rows). One command runs the arms it is given,
one after another, each in its own process (clean allocator, honest peak memory), on data it writes
once, and prints and writes one table.

The data an arm reads is named by its experiment's `data.path` (or its reference module): the harness
writes that file under $OUT and points the arm at it.
- rows.jsonl: bimodal token rows (bench/common.py), the dense, MoE and vocabulary arms' and hf_arm's;
- pairs.jsonl: the DPO bench pairs (bench/pairs.py, `--pairs` of them), the DPO and TRL arms';
- pair_rows.jsonl: the sequences of those pairs as token rows, for an SFT arm on what DPO forwards;
- teacher/: a distillation arm's teacher (bench/teacher.py), the student's model at another init.
A DPO or reward-model arm's table row adds pairs/s, a KTO arm's examples/s; ratios between two arms that
count the same unit are of it (GRPO and distillation arms: completions/s, in a table of their own), else
of real tokens/s.

    python bench/run.py hf_padded hf_ceiling dense_best dense_eager     # results under $OUT (default outputs/bench)
    python bench/run.py experiment=bench/moe_fast hf_moe_fwd_bwd         # experiment=... names work too
    python bench/run.py --list                                          # every arm
    python bench/run.py --dry-run dense_best hf_padded                  # validate and print the commands only
    python bench/run.py --tiny dense_eager hf_padded --steps 4 --warmup 2 --rows 200   # CPU shake-out
    python bench/run.py trl_dpo_ref dpo_best --hf-steps 20 --hf-warmup 5 --deadline 400   # DPO against TRL
    python bench/run.py kto_default trl_kto --hf-steps 20 --hf-warmup 5 --deadline 300    # KTO against TRL

An arm whose experiment selects parallel=fsdp or parallel=ep is launched on --nproc processes through
launchers/torchrun.sh; its rates are per GPU. Each arm's result is $OUT/<arm>.json; the table is
$OUT/bench.md and everything together $OUT/bench.json. Measured numbers go to docs/benchmarks/log.md as
an entry with their date, machine, commit and command (the latest into docs/performance.md), never into this
code.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import grpo_rows, handwritten_arm, hf_arm, trl_arm, trl_grpo, trl_objectives  # noqa: E402
from bench.common import (  # noqa: E402
    MAX_LEN,
    add_ratios,
    bimodal_lengths,
    compose_typed,
    experiment_config,
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
from bench.pairs import PAIR_ROWS_FILE, PAIRS_FILE, check_count, gsm8k_triples, write_bench_data  # noqa: E402
from bench.teacher import TEACHER_DIR, teacher_key, write_teacher  # noqa: E402

LAUNCHER = ROOT / "launchers" / "torchrun.sh"
ROWS_FILE = "rows.jsonl"
DATA_FILES = (ROWS_FILE, PAIRS_FILE, PAIR_ROWS_FILE)
"""The files the harness writes; an arm's experiment names one of them as its data.path."""
MODULES = (hf_arm, trl_arm, trl_grpo, trl_objectives, handwritten_arm)
REFERENCE_MODULES = {a: m for m in MODULES for a in m.REFERENCE_ARMS}
REFERENCE_ARMS = {a: e for m in MODULES for a, e in m.REFERENCE_ARMS.items()}
"""reference arm -> the align experiment whose model it builds."""


@dataclass
class Arm:
    """One arm of a command, resolved: what runs, where it writes, what it needs of the shared data."""

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
    data_file: str = ROWS_FILE
    """Which of DATA_FILES the arm reads (written under $OUT); "" for a bundled source (GRPO's GSM8K prompts);
    TEACHER_DIR for a distillation arm (its prompts are bundled, its teacher is written under $OUT)."""
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


def align_overrides(arm: Arm, a: argparse.Namespace, out: Path) -> list[str]:
    """The experiment plus what belongs to this command, not to the experiment: the data file it
    wrote, its cache dir, its step count, and with --tiny the CPU-sized preset."""
    experiment = [f"experiment={arm.experiment}"]
    own = _typed_or_die(arm, experiment)
    tiny = tiny_overrides(own) if a.tiny else []
    steps = [f"trainer.max_steps={a.steps}"] if a.steps is not None else []
    if own.objective.kind == "distill":  # bundled prompts; the teacher the harness writes
        arm.data_file = TEACHER_DIR
        return [*experiment, f"objective.teacher={out / TEACHER_DIR}", f"data.cache_dir={out / 'cache'}",
                "allow_dirty=true", *steps, *tiny, *artifacts(arm, a)]
    if own.objective.kind == "grpo" and not own.data.path:  # GRPO's bundled prompts: nothing to write
        arm.data_file = ""
        return [*experiment, f"data.cache_dir={out / 'cache'}", "allow_dirty=true", *steps, *tiny, *artifacts(arm, a)]
    arm.data_file = Path(own.data.path or "").name
    if arm.data_file not in DATA_FILES:
        die(f"{arm.name} (experiment={arm.experiment}): data.path={own.data.path} names no file the harness writes; "
            f"accepted: outputs/bench/<one of {', '.join(DATA_FILES)}> (grpo: bundled prompts, no data.path)")
    return [*experiment, f"data.path={out / arm.data_file}", f"data.cache_dir={out / 'cache'}", "allow_dirty=true",
            *steps, *tiny, *artifacts(arm, a)]


def artifacts(arm: Arm, a: argparse.Namespace) -> list[str]:
    """--compile-artifacts: each align arm loads and saves torch.compiler's portable artifacts in its own
    file there (trainer.compile_artifacts), so a later command on a fresh machine skips those compiles."""
    if a.compile_artifacts is None:
        return []
    return [f"trainer.compile_artifacts={Path(a.compile_artifacts).resolve() / (arm.name + '.bin')}"]


def _typed_or_die(arm: Arm, overrides: list[str]):
    from align.run.cli import describe

    try:
        return compose_typed(overrides)
    except Exception as exc:  # a composition or value error of this arm: one line, before any run
        die(f"{arm.name} (experiment={arm.experiment}): {describe(exc)}")


def plan_align(arm: Arm, a: argparse.Namespace, out: Path) -> Arm:
    arm.overrides = overrides = align_overrides(arm, a, out)
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


def plan_reference(arm: Arm, a: argparse.Namespace, out: Path) -> Arm:
    if not 1 <= a.hf_warmup < a.hf_steps:
        die(f"{arm.name}: --hf-warmup {a.hf_warmup} must be >= 1 and below --hf-steps {a.hf_steps}")
    module = REFERENCE_MODULES[arm.name]
    arm.typed = experiment_config(REFERENCE_ARMS[arm.name], a.tiny)
    arm.run_dir = out / "runs" / arm.name
    data_file, flag = reference_data(module, arm.name)
    arm.data_file = data_file or ""
    data = [flag, str(out / arm.data_file)] if data_file else []
    arm.cmd = [sys.executable, str(Path(module.__file__).resolve()), "--arm", arm.name, "--steps", str(a.hf_steps),
               "--warmup", str(a.hf_warmup), *data, "--out", str(arm.run_dir / "measurement.json"),
               *(["--tiny"] if a.tiny else [])]
    arm.vocab = hf_config(arm.typed).vocab_size
    return arm


def reference_data(module, name: str) -> tuple[Optional[str], Optional[str]]:
    """(what the harness writes for reference arm `name`, the flag that passes it): the module's per-arm
    DATA where its arms read different things (bench/trl_objectives.py), else its DATA_FILE and DATA_FLAG."""
    per_arm = getattr(module, "DATA", None)
    return per_arm[name] if per_arm is not None else (module.DATA_FILE, module.DATA_FLAG)


def pairs_needed(arms: list[Arm], hf_steps: int) -> dict[str, int]:
    """Reference arm -> the bench pairs its --hf-steps steps read (the TRL arms that read pairs.jsonl)."""
    need = {}
    for x in arms:
        module = REFERENCE_MODULES.get(x.name)
        if module is trl_arm:
            need[x.name] = hf_steps * trl_arm.PAIRS_PER_STEP
        elif module is trl_objectives and x.data_file == PAIRS_FILE:
            need[x.name] = trl_objectives.pairs_needed(x.name, hf_steps)
    return need


def check_one_teacher(arms: list[Arm]) -> None:
    """One command writes one teacher: its distillation arms must share the student it is built from."""
    students = {x.name: teacher_key(x.typed) for x in arms if x.data_file == TEACHER_DIR}
    if any(k != next(iter(students.values())) for k in students.values()):
        die(f"{', '.join(students)}: their students differ (model or trainer.seed) and one command writes one "
            f"teacher ($OUT/{TEACHER_DIR}); accepted: distillation arms of one student per command")


def plan(tokens: Sequence[str], a: argparse.Namespace, out: Path) -> list[Arm]:
    """Resolve and validate every arm of the command (exit 2 on the first bad one), running nothing."""
    arms = [resolve(t) for t in tokens]
    names = [x.name for x in arms]
    if len(set(names)) != len(names):
        die(f"an arm is named twice: {' '.join(names)}")
    for n in a.baseline:
        if n not in names:
            die(f"--baseline {n}: not an arm of this command ({' '.join(names)})")
    for probe, n in a.probes:
        if n not in names or n in REFERENCE_ARMS:
            die(f"--{'profile' if probe == 'kernels' else probe} {n}: not an align arm of this command "
                f"({' '.join(names)})")
    arms = [plan_reference(x, a, out) if x.experiment is None else plan_align(x, a, out) for x in arms]
    check_one_teacher(arms)
    return arms


PROBES = {
    "kernels": ["probe.kernels.warmup=6", "probe.kernels.timed_steps=4", "probe.kernels.steps=3"],
    "scaling": ["probe.scaling.warmup=2", "probe.scaling.repeats=3", "probe.scaling.measure_steps=4"],
}
"""What each probe `--profile` / `--scaling` runs takes besides the arm's own overrides."""


def probe_command(arm: Arm, out: Path, probe: str = "kernels") -> list[str]:
    """An align.tools.probe run (the kernel table, or the scaling fit) on an align arm's exact configuration."""
    overrides = [o for o in arm.overrides if not o.startswith("trainer.max_steps=")]  # the probe counts its own
    extra = list(PROBES[probe])
    if probe == "scaling":
        # Four widths a factor of two apart up to the bench rows' clip, at the rows the budget holds at the
        # longest: the points stay inside what the arm's memory plan was sized for, and the fourth checks
        # a constant term that three points cannot (the probe asks for one when the two-term fit misses).
        longest = min(arm.typed.data.max_seq_len, MAX_LEN)
        budget = arm.typed.sampler.max_tokens
        rows = max(1, budget // longest) if isinstance(budget, int) else 1
        widths = ",".join(str(longest >> k) for k in (3, 2, 1, 0))
        extra += [f"probe.scaling.lengths=[{widths}]", f"probe.scaling.batch_size={rows}"]
    return [sys.executable, "-m", "align.tools.probe", f"probe={probe}", *extra, *overrides,
            f"hydra.run.dir={out / 'runs' / (probe + '_' + arm.name)}"]


# -------------------------------------------------------------------------------------- the data


@dataclass
class Data:
    """What this command wrote: each file's sequence lengths (the useful-FLOPs convention reads them)."""

    lengths: dict[str, np.ndarray] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


def write_shared_teacher(arms: list[Arm], out: Path, data: Data) -> None:
    """The teacher of the command's distillation arms (one student: `check_one_teacher`), once."""
    student = next((x for x in arms if x.data_file == TEACHER_DIR), None)
    if student is not None:
        data.lines.append(write_teacher(out, student.typed))


def write_data(arms: list[Arm], a: argparse.Namespace, out: Path) -> Data:
    """Write every file an arm of the command reads, once."""
    need = {x.data_file for x in arms}
    data = Data()
    if ROWS_FILE in need:
        lengths = bimodal_lengths(a.rows)
        if a.long_rows:  # rows past the bimodal clip, for arms that hold them (data.max_seq_len at least this)
            lengths = np.concatenate([lengths, np.resize(np.asarray(a.long_len, dtype=lengths.dtype), a.long_rows)])
        vocab = min(x.vocab for x in arms if x.data_file == ROWS_FILE)
        write_rows(out / ROWS_FILE, token_rows(lengths, vocab))
        mean, m2 = float(lengths.mean()), float((lengths.astype(float) ** 2).mean())
        data.lengths[ROWS_FILE] = lengths
        data.lines.append(f"data: {a.rows} rows below id {vocab}, mean {mean:.0f} tokens, E[w^2]/E[w]^2 "
                          f"{m2 / mean**2:.2f}, max {lengths.max()}")
    pair_files = [f for f in (PAIRS_FILE, PAIR_ROWS_FILE) if f in need]
    if pair_files:
        stats = write_bench_data(out, a.pairs, pair_files)
        seq = np.asarray(stats.pop("sequence_lengths"), dtype=np.int64)
        for f in pair_files:
            data.lengths[f] = seq
        data.lines.append(f"data: {stats['pairs']} GSM8K pairs ({', '.join(pair_files)}), "
                          f"{stats['tokens_per_pair']:.0f} tokens per pair (both sequences), longest sequence "
                          f"{stats['longest_sequence']}")
    write_shared_teacher(arms, out, data)
    return data


# -------------------------------------------------------------------------------------- measuring


def read_align_run(arm: Arm, warmup: int, useful_per_token: float) -> dict[str, Any]:
    """An align run's measurement from its history.jsonl (wall clock between step boundaries, tokens
    summed over ranks) and provenance.json; per GPU when it ran on several. A DPO or reward-model run's
    rows count its pairs, a KTO run's its examples."""
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
    pairs = [r.get("pairs") for r in m]
    examples = [r.get("examples") for r in m]
    compiled = [r.get("compile_s") for r in (rows[warmup - 1], m[-1])]
    reference = ((prov.get("objective") or {}).get("reference") or {}).get("resolved")
    return measurement(
        arm.name, seconds, len(m), real, sum(r["tokens"] for r in m) / arm.gpus,
        sum(counted) if None not in counted else None, real * useful_per_token, max(peaks) if peaks else None,
        gpus=arm.gpus, step_ms=[round(r["step_time_s"] * 1000) for r in m], last_loss=rows[-1].get("loss"),
        alloc_retries=rows[-1].get("mem_alloc_retries"), attn=model.get("attn_implementation_resolved"),
        experts=model.get("experts_implementation_resolved"), optimizer=extra.get("optimizer_impl"),
        optimizer_step=(extra.get("optimizer_step") or {}).get("kind"), dynamo=prov.get("dynamo"),
        compile_s_measured=None if None in compiled else compiled[1] - compiled[0], **eval_cost(prov, rows),
        **({"pairs": sum(pairs) / arm.gpus, "reference": reference} if None not in pairs else {}),
        **({"examples": sum(examples) / arm.gpus, "reference": reference} if None not in examples else {}))


def eval_cost(prov: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """An arm with the in-training eval: its total seconds, share of the run's wall time, and its rate
    (every eval step's samples/s); nothing for an arm without one."""
    ev = (prov.get("throughput") or {}).get("eval")
    if not ev:
        return {}
    rates = [r["eval/samples_per_s"] for r in rows if r.get("eval/samples_per_s") is not None]
    return {"eval_seconds": ev["seconds"], "eval_count": ev["count"], "eval_share": ev["eval_share"],
            "eval_samples_per_s": rates}


def run_logged(cmd: list[str], log: Path, env: dict, timeout: Optional[float]) -> Optional[int]:
    """Run `cmd` in its own process group, output to `log`; None when it outlived `timeout` (killed,
    its whole group: a launcher's workers too)."""
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None


HYDRA_HINT = "Set the environment variable HYDRA_FULL_ERROR=1"


def last_words(log: Path) -> str:
    """The line of a failed arm's log that says why: its last, Hydra's hint to set HYDRA_FULL_ERROR left out."""
    lines = [ln for ln in log.read_text().strip().splitlines() if ln.strip() and not ln.startswith(HYDRA_HINT)]
    return (lines or [""])[-1][:300]


def run_arm(arm: Arm, a: argparse.Namespace, out: Path, env: dict, data: Data,
            timeout: Optional[float]) -> dict[str, Any]:
    shutil.rmtree(arm.run_dir, ignore_errors=True)  # this OUT's previous result of the arm, not a run to resume
    arm.run_dir.mkdir(parents=True)
    log = out / f"{arm.name}.log"
    rc = run_logged(arm.cmd, log, env, timeout)
    if rc is None:
        return {"arm": arm.name, "error": f"killed at the --deadline after {timeout:.0f}s (log: {log})"}
    if rc != 0:
        return {"arm": arm.name, "error": f"exit {rc}: {last_words(log)} (log: {log})"}
    if arm.experiment is None:
        return json.loads((arm.run_dir / "measurement.json").read_text())
    if grpo_rows.is_rollout(arm.typed):
        return grpo_rows.read_grpo_run(arm.name, arm.run_dir, a.warmup, arm.gpus)
    return read_align_run(arm, a.warmup, useful_flops_per_token(model_flops(arm.typed), data.lengths[arm.data_file]))


COMPILE_IN_WINDOW_S = 0.5
"""Compile seconds inside an arm's measured steps past which its row says the rate includes a compile
(dynamo's own timers tick by a little on cache hits and guard checks)."""


def notes(r: dict[str, Any]) -> str:
    if "error" in r:
        return r["error"]
    parts = []
    if (r.get("compile_s_measured") or 0) > COMPILE_IN_WINDOW_S:
        parts.append(f"COMPILED {r['compile_s_measured']:.1f} s INSIDE THE MEASURED STEPS: the rate includes it "
                     "(raise --warmup)")
    parts += [f"{k}={r[k]}" for k in ("reference", "attn", "experts", "optimizer_step") if r.get(k)]
    trl = r.get("trl") or {}
    if r.get("setting"):  # a reference arm that states its own settings (bench/trl_objectives.py)
        parts.append(r["setting"])
    elif trl.get("generation_batch_size") is not None:  # GRPOTrainer's rollout shape and generation backend
        parts.append(f"TRL {trl.get('version')}, {trl['generation_batch_size']} completions per step in "
                     f"{trl.get('gradient_accumulation_steps')} x {trl.get('per_device_train_batch_size')}, "
                     f"use_vllm={trl.get('use_vllm')}, gradient_checkpointing={trl.get('gradient_checkpointing')}")
    elif trl:
        parts.append(f"TRL {trl.get('version')}, precompute_ref_log_probs={trl.get('precompute_ref_log_probs')}, "
                     f"gradient_checkpointing={trl.get('gradient_checkpointing')}")
    engine = r.get("engine") or {}
    if engine.get("mode"):
        parts.append(f"engine mode={engine['mode']}, batch {engine.get('batch_size')}")
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
    """The command's table; GRPO arms (they count completions) in a table of their own below it."""
    grpo = [r for r in results if r.get("samples_per_s") is not None or r.get("grpo")]
    rest = [r for r in results if r not in grpo]
    parts = [_table(rest, ceiling, baselines)] if rest or not grpo else []
    if grpo:
        parts.append(grpo_rows.table(grpo, baselines, notes))
    return "\n\n".join(parts)


def _table(results: list[dict[str, Any]], ceiling: Optional[float], baselines: Sequence[str]) -> str:
    pairs = any(r.get("pairs_per_s") is not None for r in results)
    examples = any(r.get("examples_per_s") is not None for r in results)
    head = ["arm", *(["pairs/s"] if pairs else []), *(["examples/s"] if examples else []), "real tok/s", "tok/s",
            "padding waste", "tokens/step",
            "useful MFU", "counted MFU", "peak GiB", *[f"vs {b}" for b in baselines], "notes"]
    lines = [f"bf16 matmul ceiling measured in this command: {_fmt(ceiling, '.0f')} TFLOP/s", "",
             "| " + " | ".join(head) + " |", "| --- " + "| ---: " * (len(head) - 2) + "| --- |"]
    for i, r in enumerate(results, 1):
        g = r.get
        cells = [f"({i}) {r['arm']}", *([_fmt(g("pairs_per_s"), ",.1f")] if pairs else []),
                 *([_fmt(g("examples_per_s"), ",.1f")] if examples else []),
                 _fmt(g("real_tokens_per_s"), ",.0f"), _fmt(g("tokens_per_s"), ",.0f"),
                 _fmt(g("padding_waste"), ".1%"), _fmt(g("tokens_per_step"), ",.0f"), _fmt(g("useful_mfu"), ".1%"),
                 _fmt(g("counted_mfu"), ".1%"), _fmt(g("peak_mem_gib"), ".1f"),
                 *[_fmt(g(f"vs_{b}"), ".2f") + ("x" if g(f"vs_{b}") is not None else "") for b in baselines], notes(r)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "useful MFU: model FLOPs of the real tokens, each row at its own length: 4N per token on the active "
                  "parameters (forward and input-gradient backward) plus 2N on the trainable ones (weight gradients), "
                  "so 6N for full training and 4N plus the adapters' 6N for LoRA, plus attention. counted MFU: the same"
                  " convention over the batches as they were shaped, padding included, as the arm counted them."]
    if pairs:
        lines += ["", "Ratios between two DPO or reward-model arms are of pairs/s, else of real tokens/s. MFU counts "
                      "the policy's training FLOPs of the real tokens (a live reference's forward is not counted)."]
    if examples:
        lines += ["", "Ratios between two KTO arms are of examples/s (an unpaired example: its completion and its "
                      "KL sequence), else of real tokens/s; real tokens count both sequences of every example."]
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
    ap.add_argument("--long-rows", type=int, default=0,
                    help="rows of --long-len tokens added to the bimodal rows (an arm whose data.max_seq_len "
                         "is shorter drops them: data.truncation=drop)")
    ap.add_argument("--long-len", default="16384",
                    help="the length of the --long-rows rows, or comma-separated lengths the rows cycle through "
                         "(ragged long rows: each width past one attention pass is a shape the compiled blocks meet)")
    ap.add_argument("--pairs", type=int, default=1024, help="DPO bench pairs in the shared pair files")
    ap.add_argument("--nproc", type=int, default=2, help="processes (GPUs) of an arm with parallel=fsdp or ep")
    ap.add_argument("--baseline", default=None,
                    help="comma-separated arms of this command to give ratios against (default: its reference arms)")
    ap.add_argument("--profile", default="",
                    help="comma-separated align arms whose kernel table to print after the arms")
    ap.add_argument("--scaling", default="",
                    help="comma-separated align arms whose scaling fit (probe=scaling) to print after the arms")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds from the command's start: no arm starts after it, a running arm is killed at it "
                         "(both recorded as errors); the table is written either way")
    ap.add_argument("--engine-eval", action="store_true",
                    help="after the arms, measure the generation engine's eval throughput (bench/generation.py) at "
                         "each align GRPO or distillation arm's rollout shape, for its `vs engine eval` column")
    ap.add_argument("--compile-artifacts", default=None, metavar="DIR",
                    help="every align arm loads and saves torch.compiler's portable cache artifacts as DIR/<arm>.bin "
                         "(trainer.compile_artifacts): carry DIR to the next fresh machine to skip those compiles")
    ap.add_argument("--tiny", action="store_true", help="every arm's tiny preset on the CPU: checks the harness, "
                                                        "measures nothing")
    a = ap.parse_args(argv)
    a.probes = [(probe, x) for probe, names in (("kernels", a.profile), ("scaling", a.scaling))
                for x in (arm_name(p) for p in names.split(",")) if x]
    a.baseline = [x for x in (arm_name(p) for p in a.baseline.split(",")) if x] if a.baseline is not None else \
        [arm_name(t) for t in a.arms if arm_name(t) in REFERENCE_ARMS]
    try:
        a.long_len = [int(x) for x in str(a.long_len).split(",")]
    except ValueError:
        a.long_len = []
    if a.long_rows < 0 or not a.long_len or min(a.long_len) < 1:
        die(f"--long-rows {a.long_rows} --long-len {a.long_len}: accepted: rows >= 0 of comma-separated lengths >= 1")
    if a.deadline is not None and a.deadline <= 0:
        die(f"--deadline {a.deadline}: accepted: seconds > 0")
    a.started = time.time()
    return a


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    if a.list:
        print("reference arms (bench/hf_arm.py):", " ".join(sorted(hf_arm.REFERENCE_ARMS)))
        print("reference arms (bench/trl_arm.py):", " ".join(sorted(trl_arm.REFERENCE_ARMS)))
        print("reference arms (bench/trl_grpo.py):", " ".join(sorted(trl_grpo.REFERENCE_ARMS)))
        print("reference arms (bench/trl_objectives.py):", " ".join(sorted(trl_objectives.REFERENCE_ARMS)))
        print("reference arms (bench/handwritten_arm.py):", " ".join(sorted(handwritten_arm.REFERENCE_ARMS)))
        print("align arms (conf/experiment/bench/):", " ".join(experiment_names()))
        return 0
    if not a.arms:
        die("name at least one arm (python bench/run.py --list)")
    out = Path(os.environ.get("OUT", "outputs/bench")).resolve()
    arms = plan(a.arms, a, out)
    if any(x.data_file in (PAIRS_FILE, PAIR_ROWS_FILE) for x in arms):
        try:
            check_count(a.pairs, len(gsm8k_triples()))
        except ValueError as e:
            die(str(e))
    need = pairs_needed(arms, a.hf_steps)
    if need and a.pairs < max(need.values()):
        die(f"--pairs {a.pairs}: {', '.join(f'{n} reads {k}' for n, k in need.items())} in {a.hf_steps} steps "
            f"(--hf-steps); accepted: --pairs >= {max(need.values())}")
    if a.dry_run:
        for arm in arms:
            print(f"{arm.name}: {shlex.join(arm.cmd)}")
        for probe, name in a.probes:
            arm = next(x for x in arms if x.name == name)
            print(f"{probe} of {name}: {shlex.join(probe_command(arm, out, probe))}")
        return 0
    return execute(arms, a, out)


def remaining(a: argparse.Namespace) -> Optional[float]:
    return None if a.deadline is None else a.deadline - (time.time() - a.started)


def measure(arm: Arm, a: argparse.Namespace, out: Path, env: dict, data: Data, ceiling: Optional[float]) -> dict:
    """One arm's result row: measured, or why not (the deadline passed, the run failed)."""
    t0, left = time.time(), remaining(a)
    if left is not None and left <= 0:
        return {"arm": arm.name, "error": f"not run: --deadline {a.deadline:.0f}s had passed", "wall_s": 0.0}
    try:
        m = run_arm(arm, a, out, env, data, left)
    except (RuntimeError, OSError, KeyError, ValueError) as e:  # one arm's unreadable output, not the command's
        m = {"arm": arm.name, "error": f"{type(e).__name__}: {e}"}
    r = m if "error" in m else summarise(m, ceiling)
    if grpo_rows.is_rollout(arm.typed):
        r["grpo"] = True  # its row goes to the GRPO table, measured or not
    r.update(command=shlex.join(arm.cmd), wall_s=round(time.time() - t0, 1))
    return r


def progress(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"{r['arm']}: {r['error']}"
    if r.get("samples_per_s") is not None:
        return (f"{r['arm']}: {r['samples_per_s']:,.1f} samples/s, generation {r['generation_share']:.0%} of the "
                f"step, peak {_fmt(r['peak_mem_gib'], '.1f')} GiB ({r['wall_s']:.0f}s)")
    pairs = f"{r['pairs_per_s']:,.1f} pairs/s, " if r.get("pairs_per_s") is not None else ""
    return (f"{r['arm']}: {pairs}{r['real_tokens_per_s']:,.0f} real tok/s, waste {r['padding_waste']:.1%}, "
            f"peak {_fmt(r['peak_mem_gib'], '.1f')} GiB ({r['wall_s']:.0f}s)")


def engine_evals(arms: list[Arm], results: list[dict[str, Any]], a: argparse.Namespace, out: Path, env: dict) -> None:
    """The engine's eval throughput at each align GRPO arm's rollout shape, once per shape, inside the deadline."""
    shapes = grpo_rows.engine_shapes(arms)
    done: dict[tuple[int, int, int], dict[str, Any]] = {}
    for shape in dict.fromkeys(shapes.values()):
        left = remaining(a)
        done[shape] = ({"error": f"not run: --deadline {a.deadline:.0f}s had passed"} if left is not None and left <= 0
                       else grpo_rows.engine_eval(shape, out, a.tiny, env, left, run_logged))
        print(f"engine eval {shape}: {done[shape]}", flush=True)
    grpo_rows.add_engine_ratios(results, {name: done[shape] for name, shape in shapes.items()})


def execute(arms: list[Arm], a: argparse.Namespace, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    data = write_data(arms, a, out)
    for line in data.lines:
        print(line, flush=True)
    ceiling = matmul_ceiling_tflops()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "PYTHON": sys.executable}  # launchers/torchrun.sh runs $PYTHON
    results = []
    for arm in arms:
        r = measure(arm, a, out, env, data, ceiling)
        results.append(r)
        (out / f"{arm.name}.json").write_text(json.dumps(_clean(r), indent=1))
        print(progress(r), flush=True)
    add_ratios(results, a.baseline)
    if a.engine_eval:
        engine_evals(arms, results, a, out, env)
    md = table(results, ceiling, a.baseline)
    print(md)
    (out / "bench.md").write_text(md + "\n")
    (out / "bench.json").write_text(json.dumps(_clean({"ceiling_tflops": ceiling, "rows": a.rows, "pairs": a.pairs,
                                                       "data": data.lines, "baselines": a.baseline,
                                                       "results": results}), indent=1))
    for probe, name in a.probes:
        arm = next(x for x in arms if x.name == name)
        run_dir = out / "runs" / f"{probe}_{name}"
        cmd = probe_command(arm, out, probe)
        shutil.rmtree(run_dir, ignore_errors=True)  # this OUT's previous result: a probe never writes over a run
        with (out / f"{probe}_{name}.log").open("w") as f:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
        report = run_dir / f"{probe}.md"
        print(f"---- {probe} of {name} (exit {rc}) ----")
        print(report.read_text() if report.exists() else (out / f"{probe}_{name}.log").read_text()[-3000:], flush=True)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
