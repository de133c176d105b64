"""What a person reads of a run (rank 0): one short block when training starts (model, objective,
data, sampler and budget, device, run dir) and a summary when it ends (steps, tokens, wall time,
tokens/s, the objective's final metrics, where the export and the manifest are).

Every line goes through the `align` logger, so it reaches the console and train.log alike (Hydra's
job logging holds both handlers). The objective names the metrics a person watches
(`console_metrics`, align/objectives/interface.py); the progress line (align/telemetry/progress.py) and
the loss plot (align/telemetry/plots.py) print those; the trainer guesses none of them.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

log = logging.getLogger("align")

Metric = tuple[str, str]
"""(label a person reads, key of the step's history row)."""


def fmt(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "n/a" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    readable = value == 0 or (math.isfinite(value) and abs(value) >= 1e-3)  # else 3 significant digits
    return f"{value:.4f}" if readable else f"{value:.3g}"


def watched(objective: Any) -> tuple[Metric, ...]:
    """The objective's console metrics; the loss for an objective that names none."""
    return tuple(getattr(objective, "console_metrics", None) or (("loss", "loss"),))


def metric_fields(metrics: Sequence[Metric], row: Mapping[str, Any]) -> str:
    """`label value` for each of the objective's metrics the row holds (a GRPO step that only replays
    a rollout has no reward of its own: that metric is left out, never printed as 0)."""
    return " ".join(f"{label} {fmt(row[key])}" for label, key in metrics if row.get(key) is not None)


def _count(n: Optional[int]) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def _formats(meta: Mapping[str, Any]) -> str:
    formats = meta.get("formats") or {}
    if not isinstance(formats, Mapping) or not formats:
        return "format n/a"
    return ", ".join(f"{src}: {f.get('format', f) if isinstance(f, Mapping) else f}" for src, f in formats.items())


def start_lines(trainer: Any) -> list[str]:
    cfg, info = trainer.cfg, trainer.model_info
    stats = dict(getattr(trainer.data, "stats", None) or {})
    meta = dict(getattr(trainer.data, "meta", None) or {})
    records = stats.get("records_kept", len(trainer.data) if hasattr(trainer.data, "__len__") else None)
    lora, loss = " (LoRA)" if info.get("lora") else "", info.get("loss")
    sampler, t = cfg.sampler, cfg.trainer
    shape = (f"max_tokens {sampler.max_tokens}" if sampler.kind.value == "budget"
             else f"micro-batch {sampler.micro_batch_size}")
    return [
        f"model     {info.get('family')} {info.get('model_class')}{lora}: {_count(info.get('params_trainable'))} "
        f"trainable / {_count(info.get('params_total'))} params, {info.get('dtype')}",
        f"objective {trainer.objective.name} (loss {loss.get('kind') if isinstance(loss, Mapping) else loss}); "
        "watching: "
        + ", ".join(label for label, _ in watched(trainer.objective)),
        f"data      {fmt(records)} records, {fmt(stats.get('tokens'))} tokens, {_formats(meta)}",
        f"sampler   {sampler.kind.value}, {shape}, grad_accum {t.grad_accum}; budget {t.max_steps} steps",
        f"device    {trainer.env.device} x{trainer.env.world}",
        f"run dir   {trainer.run_dir}",
    ]


def step_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The step rows of history.jsonl (closed by now; every segment of a resumed run)."""
    from align.telemetry.history import read_history

    path = Path(run_dir) / "history.jsonl"
    return [r for r in read_history(path) if "step" in r] if path.is_file() else []


def end_lines(trainer: Any, code: int, wall_s: float, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """`wall_s` is this attempt's: its tokens/s counts the tokens of the steps it trained (a resumed
    run's earlier steps were another process's)."""
    from align.core.provenance import MANIFEST

    s, run_dir = trainer.state, Path(trainer.run_dir)
    first = int((trainer.model_info.get("resumed_from") or {}).get("step", 0))
    tokens = sum(int(r.get("tokens") or 0) for r in rows if r["step"] > first)
    export = run_dir / "export"
    return [
        f"done      exit {code}: {s.step} steps" + (f" (resumed at {first})" if first else "")
        + f", {fmt(tokens)} tokens in {wall_s:,.1f}s ({tokens / max(wall_s, 1e-9):,.0f} tokens/s)",
        "final     " + (metric_fields(watched(trainer.objective), rows[-1] if rows else {}) or "no step logged"),
        f"export    {export if export.is_dir() else 'none (trainer.export=false or the run did not finish)'}",
        f"manifest  {run_dir / MANIFEST}",
    ]


def announce_start(trainer: Any) -> None:
    if trainer.env.is_main:
        for line in start_lines(trainer):
            log.info(line)


def announce_end(trainer: Any, code: int, wall_s: float) -> None:
    if trainer.env.is_main:
        for line in end_lines(trainer, code, wall_s, step_rows(trainer.run_dir)):
            log.info(line)

