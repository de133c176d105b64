"""Resume: which checkpoint, and whether this run may continue it.

The silent-wrong-result bug of every peer is resuming with another data position (docs/pitfalls.md#15):
a checkpoint records what the run WAS (world size and layout, dataset fingerprint, sampler, model
shape); a resume that differs in any of them is refused with the reason, unless the user says
`trainer.resume_despite_mismatch=true`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from align.config import ResumePolicy, TrainConfig
from align.config.data import require_resolved
from align.control.ckpt_index import checkpoint_root, complete, problem
from align.data.encode import dataset_fingerprint
from align.errors import ConfigError
from align.telemetry.history import history_lines


def model_shape(model: torch.nn.Module) -> dict[str, Any]:
    """Class, parameter count and a hash of every (name, shape, dtype) of the UNSHARDED model."""
    h = hashlib.sha256()
    n = 0
    for name, p in model.named_parameters():
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
        n += p.numel()
    return {"class": type(model).__name__, "params": n, "sha256": h.hexdigest()}


def run_identity(cfg: TrainConfig, world: int, data, model: torch.nn.Module) -> dict[str, Any]:
    """What a checkpoint must agree with to be continued by this run."""
    require_resolved(cfg.sampler.max_tokens, "the resume identity")  # a checkpoint records the budget it trained on
    sampler = {**{k: (v.value if hasattr(v, "value") else v) for k, v in dataclasses.asdict(cfg.sampler).items()},
               "seed": cfg.trainer.seed, "grad_accum": cfg.trainer.grad_accum}
    return {
        "world_size": world,
        "parallel": {"kind": cfg.parallel.kind.value, "ep_size": cfg.parallel.ep_size},
        "dataset_fingerprint": dataset_fingerprint(data),
        "sampler": sampler,
        "model_shape": model_shape(model),
    }


def mismatches(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human-readable differences between a checkpoint's identity and this run's."""
    out = []
    for key in ("world_size", "parallel", "dataset_fingerprint", "sampler", "model_shape"):
        a, b = saved.get(key), current.get(key)
        if a != b:
            out.append(f"{key} was {json.dumps(a)}, now {json.dumps(b)}")
    return out


def resume_points(cfg: TrainConfig, run_dir: Path) -> list[Path]:
    """The checkpoints this run may continue, the one to try first first: `trainer.resume_from` alone,
    else (policy `auto` or `must`) every complete checkpoint under the run dir, newest first (an older
    one is the fallback when a newer one does not load). Raises ConfigError (exit 2) when the policy
    cannot be met."""
    t = cfg.trainer
    if t.resume_from:
        why = problem(Path(t.resume_from))
        if why:
            raise ConfigError("trainer.resume_from", f"not a complete checkpoint: {why}", t.resume_from)
        return [Path(t.resume_from)]
    if t.resume == ResumePolicy.never:
        return []
    found = [p for _, p in reversed(complete(checkpoint_root(run_dir)))]
    if not found and t.resume == ResumePolicy.must:
        raise ConfigError("trainer.resume", f"must resume, and {checkpoint_root(run_dir)} holds no complete checkpoint",
                          "must")
    return found


def check_resumable(path: Path, saved: dict[str, Any], current: dict[str, Any], force: bool) -> list[str]:
    """Refuse (ConfigError, exit 2) a checkpoint written by a different run, unless forced; the
    differences are returned either way, for the log and the manifest."""
    diff = mismatches(saved.get("identity", {}), current)
    if diff and not force:
        raise ConfigError("trainer.resume", f"refusing to resume from {path}: " + "; ".join(diff)
                          + " (set trainer.resume_despite_mismatch=true to resume anyway)")
    return diff


def trim_history(path: Path, step: int) -> int:
    """Rows a killed attempt logged past the step this attempt starts from (its checkpoint's, or 0 for a
    fresh start) will be recomputed: move them from history.jsonl to history.superseded.jsonl so the
    history has one row per step. A torn last line (the kill cut an append short) is dropped: its step is
    past the checkpoint, since a step's row is written before its checkpoint, and the next append would
    otherwise continue that line. Returns how many rows moved."""
    path = Path(path)
    if not path.is_file():
        return 0
    rows, torn = history_lines(path)
    keep, drop = [], []
    for line, row in rows:
        (drop if row.get("step", 0) > step else keep).append(line)
    if drop:
        with open(path.with_name("history.superseded.jsonl"), "a") as f:
            f.write("\n".join(drop) + "\n")
    unterminated = bool(keep) and not path.read_bytes().endswith(b"\n")
    if drop or torn is not None or unterminated:
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        os.replace(tmp, path)
    return len(drop)
